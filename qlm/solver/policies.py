"""The planner extension point: which instance serves which groups, in which order?

Planners are registered by name (milp, edf, fcfs) and return a frozen Plan. The MILP planner
coarsens, warm-starts from EDF, honours a wall-time limit and falls back to EDF; see README.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from qlm.clock import Clock, WallClock
from qlm.config import PlannerConfig
from qlm.estimator.base import WaitEstimator
from qlm.grouping.group import RequestGroup
from qlm.registry import Registry
from qlm.solver.coarsen import Coarsened, coarsen
from qlm.solver.costs import CostTable, build_cost_table, evaluate
from qlm.solver.heuristics import edf_queues, fcfs_queues
from qlm.solver.milp.backends import MILP_BACKENDS, SolveStatus
from qlm.solver.milp.formulation import formulate
from qlm.solver.types import Plan, PlanInput, PlanStatus


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


_STATUS = {
    SolveStatus.OPTIMAL: PlanStatus.OPTIMAL,
    SolveStatus.FEASIBLE: PlanStatus.FEASIBLE,
    SolveStatus.TIMEOUT: PlanStatus.TIMEOUT,
}


@PLANNERS.register("milp")
class MilpPlanner(_HeuristicPlanner):
    """QLM's global scheduler: the virtual-queue MILP (README.md, C1..C9)."""

    name = "milp"

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
        coarse = self._coarsened(full, edf)
        table = build_cost_table(replace(placeable, groups=coarse.units), self.estimator)
        index = {g.id: i for i, g in enumerate(table.groups)}
        edf_units = [[index[u] for u in queue] for queue in coarse.edf_units]
        formulation = formulate(table, self._slots(table, edf_units))
        warm = formulation.values_for(edf_units) if self.config.warm_start else None
        backend = MILP_BACKENDS.create(self.config.backend)
        budget_s = self.config.time_limit_s
        if not self._on_work_budget:  # a reproducible solve must not hang on wall time
            budget_s -= self.clock.monotonic_s() - started
        outcome = backend.solve(
            formulation,
            max(0.05, budget_s),
            self.config.threads,
            warm,
            self.clock,
            deterministic_work=self.config.deterministic_work,
        )
        elapsed = self.clock.monotonic_s() - started
        extra = {"backend": self.config.backend, "baseline_objective": edf_objective}

        def fallback(reason: str) -> Plan:
            return _plan_of(
                full, edf, PlanStatus.FALLBACK, self.name, elapsed, unplaced, detail=reason, **extra
            )

        if outcome.values is None:
            return fallback(f"solver failed: {outcome.detail}")
        queues = self._expand(full, table, formulation.queues_from(outcome.values), coarse)
        if evaluate(full, queues).objective > edf_objective * (1 + 1e-9):
            return fallback(f"solver ({outcome.status}) did worse than EDF")
        return _plan_of(
            full,
            queues,
            _STATUS[outcome.status],
            self.name,
            elapsed,
            unplaced,
            detail=outcome.detail,
            **extra,
        )

    @property
    def _on_work_budget(self) -> bool:
        """CP-SAT on a deterministic work budget (the only backend that takes one)."""
        return self.config.deterministic_work is not None and self.config.backend == "cpsat"

    def _coarsened(self, full: CostTable, edf: Sequence[Sequence[int]]) -> Coarsened:
        pinned = frozenset(full.groups[g].id for gs in full.pinned.values() for g in gs)
        target = min(
            self.config.max_planning_groups,
            self.config.max_slots_per_queue * full.num_instances,
        )
        runs = [[full.groups[g] for g in queue] for queue in edf]
        return coarsen(runs, target, pinned)

    def _slots(self, table: CostTable, warm: Sequence[Sequence[int]]) -> int:
        """Slots per queue: the configured bound, raised to the longest queue of the EDF plan
        where needed, so the EDF plan is always a feasible point of the MILP."""
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
