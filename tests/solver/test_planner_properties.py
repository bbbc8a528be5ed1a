"""Property tests: whatever the input, a plan places every placeable group exactly once, only
on instances that can hold its model, and counts swaps as the queues imply."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qlm.config import PlannerConfig
from qlm.solver import Plan, PlanInput, make_planner
from tests.solver.conftest import estimator_for, random_input


def count_swaps(inp: PlanInput, plan: Plan) -> int:
    """Recount swaps independently: a model change along each queue, from the loaded model."""
    models = {g.id: g.model for g in inp.groups}
    swaps = 0
    for inst in inp.fleet.instances:
        current = inst.loaded_model
        for gid in plan.queues[inst.id]:
            swaps += models[gid] != current
            current = models[gid]
    return swaps


cases = st.tuples(
    st.integers(0, 10_000),  # seed
    st.integers(1, 14),  # groups
    st.integers(1, 5),  # instances
    st.sampled_from(["edf", "fcfs", "milp"]),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_plan_invariants(case: tuple[int, int, int, str]) -> None:
    seed, num_groups, num_instances, policy = case
    inp = random_input(seed, num_groups, num_instances)
    config = PlannerConfig(policy=policy, time_limit_s=0.3, max_planning_groups=8)
    plan = make_planner(config, estimator_for(inp)).plan(inp)

    placed = [gid for q in plan.queues.values() for gid in q]
    assert len(placed) == len(set(placed))  # never twice
    assert set(placed) | set(plan.unplaced) == {g.id for g in inp.groups}  # never lost
    assert not set(placed) & set(plan.unplaced)
    by_id = {g.id: g for g in inp.groups}
    for inst_id, gids in plan.queues.items():
        inst = inp.fleet.instance(inst_id)
        assert all(inp.fleet.can_serve(inst, by_id[g].model) for g in gids)
    for gid in plan.unplaced:  # only groups that truly fit nowhere are left out
        assert not any(inp.fleet.can_serve(i, by_id[gid].model) for i in inp.fleet.instances)
    assert plan.swaps == count_swaps(inp, plan)
