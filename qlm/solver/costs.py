"""The planner's cost model: per group x instance numbers from the estimator, and the one
function that scores an assignment (`evaluate`), shared by every planner and by the tests'
brute force. See README.md for the formulas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qlm.estimator.estimator_base import WaitEstimator
from qlm.estimator.rwt import GroupCost
from qlm.grouping.group import RequestGroup
from qlm.solver.plan_types import GroupPrediction, PlanInput
from qlm.types import Instance


@dataclass(frozen=True)
class CostTable:
    """Everything a planner needs, indexed by position: g over groups, q over instances."""

    groups: tuple[RequestGroup, ...]
    instances: tuple[Instance, ...]
    costs: Mapping[tuple[int, int], GroupCost]  # (g, q) -> cost; absent: q cannot serve g
    swap_s: Mapping[tuple[str, int], float]  # (model, q) -> time to switch q to model
    base_s: tuple[float, ...]  # per q: work already in the engine
    deadline_s: tuple[float, ...]  # per g: TTFT deadline, seconds from now
    completion_deadline_s: tuple[float | None, ...]
    weight: tuple[float, ...]  # per g: lateness penalty per request-second
    pinned: Mapping[int, tuple[int, ...]]  # q -> groups at the head of its queue, in order

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def num_instances(self) -> int:
        return len(self.instances)

    def compatible(self, g: int) -> list[int]:
        return [q for q in range(self.num_instances) if (g, q) in self.costs]

    def pinned_on(self, g: int) -> int | None:
        for q, gs in self.pinned.items():
            if g in gs:
                return q
        return None


def build_cost_table(inp: PlanInput, estimator: WaitEstimator) -> CostTable:
    """Build the cost table. Groups that no instance can serve must be removed beforehand."""
    groups = inp.groups
    instances = inp.fleet.instances
    costs: dict[tuple[int, int], GroupCost] = {}
    for g, group in enumerate(groups):
        for q, inst in enumerate(instances):
            cost = estimator.group_cost(group, inst)
            if cost is not None:
                costs[(g, q)] = cost
    index = {grp.id: g for g, grp in enumerate(groups)}
    pinned = {
        q: tuple(index[gid] for gid in inp.pinned.get(inst.id, ()))
        for q, inst in enumerate(instances)
        if inp.pinned.get(inst.id)
    }
    return CostTable(
        groups=groups,
        instances=instances,
        costs=costs,
        swap_s=_swap_costs(groups, instances, costs),
        base_s=tuple(inp.busy_s.get(inst.id, 0.0) for inst in instances),
        deadline_s=tuple(grp.ttft_deadline_at_s - inp.now_s for grp in groups),
        completion_deadline_s=tuple(
            None
            if grp.completion_deadline_at_s is None
            else grp.completion_deadline_at_s - inp.now_s
            for grp in groups
        ),
        weight=tuple(inp.slo_classes[grp.slo_class].lateness_weight for grp in groups),
        pinned=pinned,
    )


def _swap_costs(
    groups: Sequence[RequestGroup],
    instances: Sequence[Instance],
    costs: Mapping[tuple[int, int], GroupCost],
) -> dict[tuple[str, int], float]:
    """S(model, instance): the profile's load time. One value per (model, instance)."""
    swap: dict[tuple[str, int], float] = {}
    for (g, q), cost in costs.items():
        swap[(groups[g].model, q)] = cost.load_s
    return swap


@dataclass(frozen=True, slots=True)
class Score:
    objective: float
    predictions: Mapping[str, GroupPrediction]


def evaluate(table: CostTable, queues: Sequence[Sequence[int]]) -> Score:
    """Score an assignment: queues[q] is the ordered list of group indices on instance q.

    For each queue: the start time W begins at the instance's busy time; a group whose model
    differs from the previous one (or from the loaded model, for the first) first pays the
    swap cost; its last request's TTFT is W + ttft_lag; W then grows by its occupancy.
    Objective = sum over groups of size x (TTFT + weight x TTFT lateness + weight x completion
    lateness). This is exactly what the MILP minimises (constraints C5-C8).
    """
    total = 0.0
    predictions: dict[str, GroupPrediction] = {}
    for q, queue in enumerate(queues):
        inst = table.instances[q]
        start = table.base_s[q]
        model = inst.loaded_model
        for g in queue:
            group = table.groups[g]
            cost = table.costs[(g, q)]
            swap = group.model != model
            if swap:
                start += table.swap_s[(group.model, q)]
                model = group.model
            pred = _predict(table, g, q, cost, start, swap)
            total += group.size * (
                pred.ttft_s + table.weight[g] * (pred.ttft_late_s + pred.completion_late_s)
            )
            predictions[group.id] = pred
            start += cost.occupancy_s
    return Score(total, predictions)


def _predict(
    table: CostTable, g: int, q: int, cost: GroupCost, start_s: float, swap: bool
) -> GroupPrediction:
    ttft = start_s + cost.ttft_lag_s
    completion_deadline = table.completion_deadline_s[g]
    completion_late = (
        0.0
        if completion_deadline is None
        else max(0.0, start_s + cost.completion_lag_s - completion_deadline)
    )
    return GroupPrediction(
        instance_id=table.instances[q].id,
        start_s=start_s,
        ttft_s=ttft,
        ttft_late_s=max(0.0, ttft - table.deadline_s[g]),
        completion_late_s=completion_late,
        swap_before=swap,
    )
