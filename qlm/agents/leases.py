"""An agent's leases on the requests it holds.

Question answered: how does an agent keep the requests it runs, and learn which it lost?
Every pulled request carries a lease in the queue; the agent renews all it holds once a third
of the lease has passed. The controller requeues a request whose lease ran out (its agent
died, or stalled longer than the lease), and the queue then tells the next renewal that the
lease is lost. The agent aborts that run on its engine (`take_lost`), so the request runs in
one place again within about a third of a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from qlm.agents.rounds import Held
from qlm.clock import Clock
from qlm.queue.queue_protocol import GlobalQueue

log = logging.getLogger("qlm.agent")


class LeaseKeeper:
    def __init__(self, instance_id: str, queue: GlobalQueue, clock: Clock, lease_s: float) -> None:
        self.instance_id = instance_id
        self.queue = queue
        self.clock = clock
        self.lease_s = lease_s
        self.lost_total = 0
        self._last_renew_s = float("-inf")
        self._lost: list[tuple[str, Held]] = []  # runs whose lease the queue no longer has
        self._last_round_s = float("-inf")  # monotonic; when the agent last completed a round

    @property
    def period_s(self) -> float:
        return self.lease_s / 3

    def round_done(self) -> None:
        self._last_round_s = self.clock.monotonic_s()

    async def keep(self, held: Mapping[str, Held], stop: asyncio.Event) -> None:
        """Renew `held` on a timer of its own, so that a slow round cannot let a lease run
        out; but only while the agent's rounds complete (`round_done`): an agent whose rounds
        hang or fail lets its leases run out, and other instances take the requests."""
        while not stop.is_set():
            if self.clock.monotonic_s() - self._last_round_s <= self.lease_s:
                try:
                    await self.renew(held, force=True)
                except Exception:
                    log.exception("agent %s: lease renewal failed", self.instance_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.period_s)

    async def renew(self, held: Mapping[str, Held], *, force: bool = False) -> None:
        """Renew the leases of `held` when a period has passed since the last renewal (or
        now, with `force`); note the runs whose lease was lost."""
        now_s = self.clock.now_s()
        if not held or (not force and now_s - self._last_renew_s < self.period_s):
            return
        before, self._last_renew_s = self._last_renew_s, now_s  # callers overlap at awaits
        runs = dict(held)
        try:
            lost = await self.queue.renew_leases(self.instance_id, list(runs), self.lease_s, now_s)
        except Exception:
            self._last_renew_s = before  # retried at the next call, not a period later
            raise
        self._lost += [(rid, runs[rid]) for rid in lost]  # that run, not a later pull's

    def take_lost(self, held: Mapping[str, Held]) -> list[str]:
        """The ids in `held` whose run is one a renewal found lost; forgets every noted loss."""
        ids = {rid: None for rid, run in self._lost if held.get(rid) is run}
        self._lost.clear()
        self.lost_total += len(ids)
        return list(ids)
