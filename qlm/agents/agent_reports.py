"""The status report an agent writes about its instance (`instance_status`); the others read
it back (qlm/agents/reported_fleet.py `PeerReports`) as the live `FleetView` of the dispatch
decision (`ReportedFleet`).

The decision needs each instance's model, whether it is loading, its standby tier and the
per-class start blocks of its admitted work (qlm/agents/decision.py). In the simulator these
are exact; live they are each agent's last report, written every `agent.status_every_s` and
read back by the others at the same period, so at most about two periods old. A report older
than `stale_after_s` (its agent stopped reporting: the instance is down) counts as no
instance, as the control loop's liveness check counts it."""

from __future__ import annotations

from collections.abc import Mapping

from qlm.agents.decision import engine_blocks
from qlm.agents.drain import drain_estimate_s
from qlm.engine.engine_types import EngineObservation
from qlm.perf.profile import Profile
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
