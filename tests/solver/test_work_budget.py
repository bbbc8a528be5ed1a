"""A planner on a deterministic work budget decides nothing by the wall clock: the same input
gives the same plan and status whether building and solving seem instant or take seconds."""

from __future__ import annotations

import pytest

from qlm.config import PlannerConfig
from qlm.solver import Plan, PlanInput, make_planner
from tests.solver.conftest import estimator_for, random_input


class CrawlingClock:
    """Every reading is `step_s` later than the last: a machine slowed down a lot."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.at_s = 0.0

    def now_s(self) -> float:
        return self.monotonic_s()

    def monotonic_s(self) -> float:
        self.at_s += self.step_s
        return self.at_s


# The wall limit is only the work budget's safety net (10x): generous, so that a machine busy
# with other tests (pytest -n 2) does not reach it before the budget's work is done.
TIME_LIMIT_S = 4.0


def plan_on(inp: PlanInput, step_s: float) -> Plan:
    config = PlannerConfig(time_limit_s=TIME_LIMIT_S, deterministic_work=1.0)
    return make_planner(config, estimator_for(inp), CrawlingClock(step_s)).plan(inp)


@pytest.mark.solver
@pytest.mark.parametrize("seed", [9])
def test_work_budget_plans_do_not_depend_on_wall_time(seed: int) -> None:
    # Large enough that CP-SAT stops on its budget rather than proving optimality.
    inp = random_input(seed, num_groups=40, num_instances=4)
    instant = plan_on(inp, 0.0)
    crawling = plan_on(inp, 0.6 * TIME_LIMIT_S)  # building alone "takes" longer than the limit
    assert crawling.status == instant.status
    assert crawling.detail == instant.detail
    assert dict(crawling.queues) == dict(instant.queues)
    assert crawling.objective == instant.objective
    assert "safety net" not in instant.detail
