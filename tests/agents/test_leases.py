"""The agent's lease keeper (qlm/agents/leases.py) on the in-memory queue."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from qlm.agents.leases import LeaseKeeper
from qlm.agents.rounds import Held
from qlm.clock import VirtualClock
from qlm.queue.memory import MemoryQueue
from tests.factories import make_request


class FlakyQueue(MemoryQueue):
    """Renewals fail while `down` is set, as when Redis does not answer."""

    down = False

    async def renew_leases(
        self, instance_id: str, request_ids: Sequence[str], lease_s: float, now_s: float
    ) -> tuple[str, ...]:
        if self.down:
            raise ConnectionError("redis down")
        return await super().renew_leases(instance_id, request_ids, lease_s, now_s)


async def pulled(queue: MemoryQueue, *ids: str) -> dict[str, Held]:
    for rid in ids:
        await queue.enqueue(make_request(id=rid))
    got = await queue.pull("i0", list(ids), lease_s=3.0, now_s=0.0)
    return {r.id: Held(r, 0.0, 1) for r in got}


def test_a_failed_renewal_is_retried_at_the_next_call_not_a_period_later() -> None:
    async def run() -> None:
        clock = VirtualClock(0.0)
        queue = FlakyQueue(clock=clock)
        keeper = LeaseKeeper("i0", queue, clock, lease_s=3.0)
        held = await pulled(queue, "r0")
        clock.advance_by(1.5)
        queue.down = True
        try:
            await keeper.renew(held)
        except ConnectionError:
            pass
        else:
            raise AssertionError("the renewal should have failed")
        queue.down = False
        clock.advance_by(0.1)
        await keeper.renew(held)  # within a period of the failed try: renewed all the same
        record = await queue.get("r0")
        assert record is not None
        assert record.lease_expires_at_s == 1.6 + 3.0

    asyncio.run(run())


def test_a_lost_lease_names_its_run_not_a_later_pull_of_the_same_id() -> None:
    async def run() -> None:
        clock = VirtualClock(0.0)
        queue = MemoryQueue(clock=clock)
        keeper = LeaseKeeper("i0", queue, clock, lease_s=3.0)
        held = await pulled(queue, "r0", "r1")
        clock.advance_by(4.0)
        assert sorted(await queue.expire_leases(clock.now_s())) == ["r0", "r1"]
        await keeper.renew(held)
        # r1's old run ended meanwhile and the agent pulled it again: that run is not lost.
        held["r1"] = Held(held["r1"].request, 4.0, 2)
        assert keeper.take_lost(held) == ["r0"]
        assert keeper.take_lost(held) == []  # each loss is reported once
        assert keeper.lost_total == 1

    asyncio.run(run())


def test_renewals_wait_a_third_of_the_lease_unless_forced() -> None:
    async def run() -> None:
        clock = VirtualClock(0.0)
        queue = MemoryQueue(clock=clock)
        keeper = LeaseKeeper("i0", queue, clock, lease_s=3.0)
        held = await pulled(queue, "r0")
        await keeper.renew(held)
        clock.advance_by(0.5)
        await keeper.renew(held)  # too soon: the lease stays
        record = await queue.get("r0")
        assert record is not None
        assert record.lease_expires_at_s == 3.0
        await keeper.renew(held, force=True)
        record = await queue.get("r0")
        assert record is not None
        assert record.lease_expires_at_s == 3.5

    asyncio.run(run())
