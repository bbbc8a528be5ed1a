"""An agent's status reports, both ways: the one it writes about its instance (`instance_status`)
and those it reads of the others (`PeerReports`), which its dispatch decision reads as the
live `FleetView` (qlm/agents/live_queue.py `ReportedFleet`).

The decision needs each instance's model, whether it is loading, its standby tier and the
per-class start blocks of its admitted work (qlm/agents/decision.py). In the simulator these
are exact; live they are each agent's last report, written every `agent.status_every_s` and
read back by the others at the same period, so at most about two periods old. A report older
than `stale_after_s` (its agent stopped reporting: the instance is down) counts as no
instance, as the control loop's liveness check counts it."""

from __future__ import annotations

import math
from collections.abc import Mapping

from qlm.agents.decision import engine_blocks
from qlm.agents.drain import drain_estimate_s
from qlm.engine.types import EngineObservation
from qlm.perf.profile import Profile
from qlm.queue.base import GlobalQueue
from qlm.queue.records import InstanceStatus


def instance_status(
    instance_id: str,
    obs: EngineObservation,
    profile: Profile | None,
    load_left: float | None,
    priority: Mapping[str, int],
    at_s: float,
    tallies: tuple[int, int, tuple[int, ...]] = (0, 0, ()),
) -> InstanceStatus:
    """The report of an instance from its engine's observation; `load_left` is what is
    left of a load in progress (seconds), `tallies` the agent's (swaps, evictions, prefix
    keys)."""
    swaps, evictions, prefix_keys = tallies
    blocks = engine_blocks(obs, profile, priority)[1] if profile is not None else {}
    return InstanceStatus(
        instance_id=instance_id,
        state=str(obs.state),
        model=obs.model,
        busy_s=drain_estimate_s(obs, profile, load_left),
        running=len(obs.active),
        kv_used_tokens=obs.kv_used_tokens,
        kv_capacity_tokens=obs.kv_capacity_tokens,
        at_s=at_s,
        prefix_prompt_tokens=obs.prefix_prompt_tokens,
        prefix_hit_tokens=obs.prefix_hit_tokens,
        standby_models=obs.standby_models,
        fetching_models=obs.fetching_models,
        standby_capacity=obs.standby_capacity,
        start_blocks_s=tuple(sorted(blocks.items())),
        swaps=swaps,
        evictions=evictions,
        prefix_keys=prefix_keys,
    )


STALE_AFTER_S = 5.0  # an older report (unless 4 report periods are longer) counts as no instance


class PeerReports:
    """The other instances' last reports, re-read at most every `period_s`."""

    def __init__(self, instance_id: str, period_s: float) -> None:
        self.instance_id = instance_id
        self.period_s = period_s
        self.stale_after_s = max(STALE_AFTER_S, 4 * period_s)
        self.reports: Mapping[str, InstanceStatus] = {}
        self._read_at_s = -math.inf

    async def refresh(self, queue: GlobalQueue, now_s: float) -> None:
        """Read the reports again when the last read is a period old."""
        if now_s - self._read_at_s < self.period_s:
            return
        self._read_at_s = now_s
        self.reports = {
            s.instance_id: s
            for s in await queue.instances()
            if s.instance_id != self.instance_id and now_s - s.at_s <= self.stale_after_s
        }
