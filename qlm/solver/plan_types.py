"""Planner input and result types."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from qlm.grouping.group import RequestGroup
from qlm.types import DEFAULT_SLO_CLASSES, Fleet, SloClass


class PlanStatus(StrEnum):
    OPTIMAL = "optimal"  # the solver proved optimality (within its gap)
    FEASIBLE = "feasible"  # a solution, not proved optimal, solver stopped on its own
    TIMEOUT = "timeout"  # the time limit hit; the best solution found is returned
    FALLBACK = "fallback"  # the solver failed: its start plan is returned
    HEURISTIC = "heuristic"  # a heuristic planner (edf, fcfs) made the plan
    # milp: EDF improved by local search, the solver's start plan, because the solver had no
    # budget or found nothing better
    LOCAL = "local"


@dataclass(frozen=True)
class PlanInput:
    """A frozen snapshot for one planning round.

    busy_s: work already running on an instance (seconds until it drains).
    pinned: groups already running, by instance, in the order they run; they keep their
    instance and the head of its virtual queue.
    """

    groups: tuple[RequestGroup, ...]
    fleet: Fleet
    now_s: float
    busy_s: Mapping[str, float] = field(default_factory=dict)
    pinned: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    slo_classes: Mapping[str, SloClass] = field(
        default_factory=lambda: {c.name: c for c in DEFAULT_SLO_CLASSES}
    )
    # requests that arrived since the last full re-plan (None: unknown, as for a one-off plan):
    # the MILP's search budget grows with them (`PlannerConfig.search_s_per_request`)
    new_requests: int | None = None

    def __post_init__(self) -> None:
        ids = [g.id for g in self.groups]
        if len(ids) != len(set(ids)):
            raise ValueError("group ids must be unique")
        known = set(ids)
        instances = {i.id for i in self.fleet.instances}
        for instance_id, group_ids in self.pinned.items():
            if instance_id not in instances:
                raise ValueError(f"pinned: unknown instance {instance_id!r}")
            missing = [g for g in group_ids if g not in known]
            if missing:
                raise ValueError(f"pinned: unknown groups {missing}")
        for g in self.groups:
            if g.slo_class not in self.slo_classes:
                raise ValueError(f"group {g.id}: unknown SLO class {g.slo_class!r}")
        object.__setattr__(self, "busy_s", MappingProxyType(dict(self.busy_s)))
        object.__setattr__(self, "pinned", MappingProxyType(dict(self.pinned)))
        object.__setattr__(self, "slo_classes", MappingProxyType(dict(self.slo_classes)))


@dataclass(frozen=True, slots=True)
class GroupPrediction:
    """Where a group runs and what the planner's cost model predicts (seconds from now)."""

    instance_id: str
    start_s: float
    ttft_s: float
    ttft_late_s: float
    completion_late_s: float
    swap_before: bool


@dataclass(frozen=True)
class Plan:
    """Virtual queues: for each instance, the ordered ids of the groups it will serve."""

    queues: Mapping[str, tuple[str, ...]]
    status: PlanStatus
    policy: str
    objective: float
    solve_wall_s: float
    predictions: Mapping[str, GroupPrediction]
    unplaced: tuple[str, ...] = ()
    backend: str | None = None
    baseline_objective: float | None = None  # the EDF plan's objective, where computed
    detail: str = ""
    # the MILP's search budget (seconds, or CP-SAT deterministic seconds on a work budget);
    # 0 when no solver ran
    search_s: float = 0.0

    @property
    def swaps(self) -> int:
        return sum(p.swap_before for p in self.predictions.values())

    @property
    def late_groups(self) -> tuple[str, ...]:
        return tuple(
            gid
            for gid, p in self.predictions.items()
            if p.ttft_late_s > 0 or p.completion_late_s > 0
        )

    def instance_of(self, group_id: str) -> str | None:
        pred = self.predictions.get(group_id)
        return pred.instance_id if pred else None
