"""The planner extension point: which instance serves which groups, in which order?

Planners are registered by name (milp, edf, fcfs) and return a frozen Plan. The MILP planner
improves the EDF plan by local search, coarsens, warm-starts the solver from that plan within a
budget that grows with the requests it newly plans, and keeps that plan where the solver does
no better; see README.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from qlm.clock import Clock, WallClock
from qlm.config import PlannerConfig
from qlm.estimator.estimator_base import WaitEstimator
from qlm.grouping.group import RequestGroup
from qlm.registry import Registry
from qlm.solver.coarsen import Coarsened, coarsen
from qlm.solver.costs import CostTable, build_cost_table, evaluate
from qlm.solver.heuristics import edf_queues, fcfs_queues
from qlm.solver.local_search import Queues, improve
from qlm.solver.milp.backends import MILP_BACKENDS, SolveStatus
from qlm.solver.milp.formulation import formulate
from qlm.solver.plan_types import Plan, PlanInput, PlanStatus


class Planner(Protocol):
    def plan(self, inp: PlanInput) -> Plan: ...


PLANNERS: Registry[Planner] = Registry("planner")


def make_planner(
    config: PlannerConfig, estimator: WaitEstimator, clock: Clock | None = None
) -> Planner:
    return PLANNERS.create(config.policy, config, estimator, clock or WallClock())


def _split_unplaceable(inp: PlanInput) -> tuple[PlanInput, tuple[str, ...]]:
    """Drop groups that no instance can hold (weights + minimum KV > memory)."""
    fleet = inp.fleet
    ok: list[RequestGroup] = []
    dropped: list[RequestGroup] = []
    for g in inp.groups:
        (ok if any(fleet.can_serve(i, g.model) for i in fleet.instances) else dropped).append(g)
    for inst_id, gids in inp.pinned.items():
        inst = fleet.instance(inst_id)
        for g in inp.groups:
            if g.id in gids and not fleet.can_serve(inst, g.model):
                raise ValueError(f"group {g.id} is pinned on {inst_id}, which cannot serve it")
    return replace(inp, groups=tuple(ok)), tuple(g.id for g in dropped)


def _plan_of(
    table: CostTable,
    queues: Sequence[Sequence[int]],
    status: PlanStatus,
    policy: str,
    solve_wall_s: float,
    unplaced: tuple[str, ...],
    **extra: object,
) -> Plan:
    score = evaluate(table, queues)
    return Plan(
        queues={
            table.instances[q].id: tuple(table.groups[g].id for g in queue)
            for q, queue in enumerate(queues)
        },
        status=status,
        policy=policy,
        objective=score.objective,
        solve_wall_s=solve_wall_s,
        predictions=score.predictions,
        unplaced=unplaced,
        **extra,  # type: ignore[arg-type]
    )


class _HeuristicPlanner:
    name = ""
    schedule: Callable[[CostTable], list[list[int]]]

    def __init__(self, config: PlannerConfig, estimator: WaitEstimator, clock: Clock) -> None:
        self.config = config
        self.estimator = estimator
        self.clock = clock

    def plan(self, inp: PlanInput) -> Plan:
        started = self.clock.monotonic_s()
        placeable, unplaced = _split_unplaceable(inp)
        table = build_cost_table(placeable, self.estimator)
        queues = type(self).schedule(table)
        elapsed = self.clock.monotonic_s() - started
        return _plan_of(table, queues, PlanStatus.HEURISTIC, self.name, elapsed, unplaced)


@PLANNERS.register("edf")
class EdfPlanner(_HeuristicPlanner):
    name = "edf"
    schedule = staticmethod(edf_queues)


@PLANNERS.register("fcfs")
class FcfsPlanner(_HeuristicPlanner):
    name = "fcfs"
    schedule = staticmethod(fcfs_queues)


# Below this budget the solver is not started: building the model alone costs milliseconds, and
# CP-SAT's first solution is the hint it was given.
MIN_SEARCH_S = 0.05
# On a wall-clock limit, the local search in front of the solver stops at this share of it.
LOCAL_SHARE = 0.5

_STATUS = {
    SolveStatus.OPTIMAL: PlanStatus.OPTIMAL,
    SolveStatus.FEASIBLE: PlanStatus.FEASIBLE,
    SolveStatus.TIMEOUT: PlanStatus.TIMEOUT,
}


@PLANNERS.register("milp")
class MilpPlanner(_HeuristicPlanner):
    """QLM's global scheduler: the virtual-queue MILP (README.md, C1..C9)."""

    name = "milp"

    def __init__(self, config: PlannerConfig, estimator: WaitEstimator, clock: Clock) -> None:
        super().__init__(config, estimator, clock)
        # Made (and its solver library imported) when the control loop starts, not by the
        # first solve: importing OR-Tools takes a good part of a second, which the first
        # plan's wall budget paid, and which the live plane's CPU per request counted.
        self._backend = MILP_BACKENDS.create(config.backend)

    def plan(self, inp: PlanInput) -> Plan:
        started = self.clock.monotonic_s()
        placeable, unplaced = _split_unplaceable(inp)
        full = build_cost_table(placeable, self.estimator)
        if full.num_groups == 0:
            return _plan_of(
                full, [[] for _ in full.instances], PlanStatus.OPTIMAL, self.name, 0.0, unplaced
            )
        edf = edf_queues(full)
        edf_objective = evaluate(full, edf).objective
        start = self._start(full, edf, started)
        start_objective = evaluate(full, start).objective
        budget = self._search_budget(inp)
        extra = {
            "backend": self.config.backend,
            "baseline_objective": edf_objective,
            "search_s": budget,
        }

        def fallback(status: PlanStatus, reason: str) -> Plan:
            elapsed = self.clock.monotonic_s() - started
            return _plan_of(
                full, start, status, self.name, elapsed, unplaced, detail=reason, **extra
            )

        if budget < MIN_SEARCH_S:
            extra["search_s"] = 0.0
            return fallback(
                PlanStatus.LOCAL,
                f"no solver: a {budget:.3f} s budget for {inp.new_requests} new requests",
            )
        coarse = self._coarsened(full, start)
        table = build_cost_table(replace(placeable, groups=coarse.units), self.estimator)
        index = {g.id: i for i, g in enumerate(table.groups)}
        start_units = [[index[u] for u in queue] for queue in coarse.start_units]
        formulation = formulate(table, self._slots(table, start_units))
        warm = formulation.values_for(start_units) if self.config.warm_start else None
        backend = self._backend
        if self._on_work_budget:  # a reproducible solve must not hang on wall time
            outcome = backend.solve(
                formulation, self.config.time_limit_s, 1, warm, self.clock, budget
            )
        else:
            budget_s = max(0.05, budget - (self.clock.monotonic_s() - started))
            outcome = backend.solve(formulation, budget_s, self.config.threads, warm, self.clock)
        if outcome.values is None:
            return fallback(PlanStatus.FALLBACK, f"solver failed: {outcome.detail}")
        queues = self._expand(full, table, formulation.queues_from(outcome.values), coarse)
        if evaluate(full, queues).objective > start_objective * (1 + 1e-9):
            return fallback(
                PlanStatus.LOCAL,
                f"solver ({outcome.status}) found nothing better than local search",
            )
        elapsed = self.clock.monotonic_s() - started
        status = _STATUS[outcome.status]
        return _plan_of(
            full, queues, status, self.name, elapsed, unplaced, detail=outcome.detail, **extra
        )

    def _start(self, full: CostTable, edf: Sequence[Sequence[int]], started: float) -> Queues:
        """The solver's start, and the plan where it does no better: EDF improved by local
        search. On a wall limit the search takes at most LOCAL_SHARE of it, the solver what
        is left; on a work budget it runs to its end, so the plan does not depend on the
        machine's speed."""
        wall = None if self._on_work_budget else self.clock
        until_s = started + LOCAL_SHARE * self.config.time_limit_s
        return improve(full, edf, clock=wall, until_s=until_s)

    def _search_budget(self, inp: PlanInput) -> float:
        """The solver's budget: the configured limit (wall, or CP-SAT work), cut to
        `search_s_per_request` per request that arrived since the last full re-plan where
        that is known."""
        config = self.config
        limit = config.time_limit_s
        if self._on_work_budget:
            assert config.deterministic_work is not None
            limit = config.deterministic_work
        per_request = config.search_s_per_request
        if per_request is None or inp.new_requests is None:
            return limit
        return min(limit, per_request * inp.new_requests)

    @property
    def _on_work_budget(self) -> bool:
        """CP-SAT on a deterministic work budget (the only backend that takes one)."""
        return self.config.deterministic_work is not None and self.config.backend == "cpsat"

    def _coarsened(self, full: CostTable, start: Sequence[Sequence[int]]) -> Coarsened:
        pinned = frozenset(full.groups[g].id for gs in full.pinned.values() for g in gs)
        target = min(
            self.config.max_planning_groups,
            self.config.max_slots_per_queue * full.num_instances,
        )
        runs = [[full.groups[g] for g in queue] for queue in start]
        return coarsen(runs, target, pinned)

    def _slots(self, table: CostTable, warm: Sequence[Sequence[int]]) -> int:
        """Slots per queue: the configured bound, raised to the longest queue of the start plan
        where needed, so the start plan is always a feasible point of the MILP."""
        longest = max((len(q) for q in warm), default=1)
        return max(1, min(table.num_groups, max(self.config.max_slots_per_queue, longest)))

    def _expand(
        self,
        full: CostTable,
        table: CostTable,
        queues: Sequence[Sequence[int]],
        coarse: Coarsened,
    ) -> list[list[int]]:
        index = {g.id: i for i, g in enumerate(full.groups)}
        return [
            [index[gid] for gid in coarse.expand([table.groups[u].id for u in queue])]
            for queue in queues
        ]
