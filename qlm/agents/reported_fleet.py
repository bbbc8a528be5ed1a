"""The live plane's `FleetView` (qlm/agents/decision.py): the fleet as its agents report it.

Every agent writes its instance's status (`InstanceStatus`: its model, whether it is loading,
its standby tier, the per-class start blocks of its admitted work; qlm/agents/agent_reports.py)
every `agent.status_every_s`; `PeerReports` reads them back at the same period, so a report is
at most about two periods old, and one older than `stale_after_s` (its agent stopped
reporting: the instance is down) counts as no instance, as the control loop's liveness check
counts it. An agent sees itself exactly (`ReportedFleet.own`, its engine now) and the others
as reported; the API, which forecasts waits with the same decision, sees every instance as
reported. In the simulator every input is exact (qlm/sim/policies/qlm_dispatch.py).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from qlm.agents.decision import engine_blocks
from qlm.engine.engine_types import EngineObservation, EngineState
from qlm.queue.queue_protocol import GlobalQueue
from qlm.queue.records import InstanceStatus
from qlm.types import Fleet

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


@dataclass(frozen=True)
class ReportedFleet:
    """The live `FleetView`: this instance's engine now (`own`), the others as their agents
    last reported them (`reports`, the instances that are up; this one's own report ignored).
    Without `own` (the API's view: no engine of its own), every instance as reported."""

    fleet: Fleet
    instance_id: str
    own: EngineObservation | None
    priority: Mapping[str, int]
    reports: Mapping[str, InstanceStatus] = field(default_factory=dict)

    def _state(self, instance_id: str) -> tuple[str | None, bool]:
        """(model, loading) of an instance; (None, False) for one not heard from."""
        own = self.own
        if own is not None and instance_id == self.instance_id:
            return own.model, own.state is EngineState.LOADING
        report = self.reports.get(instance_id)
        if report is None:
            return None, False
        return report.model, report.state == str(EngineState.LOADING)

    def model_of(self, instance_id: str) -> str | None:
        return self._state(instance_id)[0]

    def serving(self, model: str) -> tuple[str, ...]:
        return tuple(i.id for i in self.fleet.instances if self._state(i.id) == (model, False))

    def loading(self, model: str) -> tuple[str, ...]:
        return tuple(i.id for i in self.fleet.instances if self._state(i.id) == (model, True))

    def standby_models(self, instance_id: str) -> Collection[str]:
        if self.own is not None and instance_id == self.instance_id:
            return self.own.standby_models
        report = self.reports.get(instance_id)
        return () if report is None else report.standby_models

    def standby_capacity(self, instance_id: str) -> int:
        if self.own is not None and instance_id == self.instance_id:
            return self.own.standby_capacity
        report = self.reports.get(instance_id)
        return 0 if report is None else report.standby_capacity

    def blocks_of(self, instance_id: str) -> tuple[float, Mapping[str, float]]:
        model = self.model_of(instance_id)
        instance = self.fleet.instance(instance_id)
        profile = None if model is None else self.fleet.profile(model, instance)
        if profile is None:
            return 0.0, {}
        if self.own is not None and instance_id == self.instance_id:
            return engine_blocks(self.own, profile, self.priority)
        report = self.reports.get(instance_id)
        blocks = {} if report is None else dict(report.start_blocks_s)
        return profile.prefill_tokens_per_s, blocks
