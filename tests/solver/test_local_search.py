"""Local search (qlm/solver/local_search.py): its queue score is the objective's, it never makes
a plan worse, it ends where no single relocation helps, pinned heads stay, and it finds the
merge of two same-model groups that EDF's one-pass placement misses."""

from __future__ import annotations

import pytest

from qlm.clock import VirtualClock
from qlm.solver import PlanInput
from qlm.solver.costs import CostTable, build_cost_table, evaluate
from qlm.solver.heuristics import edf_queues
from qlm.solver.local_search import improve, queue_cost
from tests.solver.conftest import estimator_for, one_swap_case, random_input


def _table(inp: PlanInput) -> CostTable:
    return build_cost_table(inp, estimator_for(inp))


def _relocations(table: CostTable, queues: list[list[int]]) -> list[list[list[int]]]:
    """Every plan one relocation of an unpinned group away (brute force, for checking)."""
    heads = [len(table.pinned.get(q, ())) for q in range(len(queues))]
    out = []
    for source, queue in enumerate(queues):
        for at in range(heads[source], len(queue)):
            g = queue[at]
            for target in table.compatible(g):
                moved = [list(q) for q in queues]
                moved[source].pop(at)
                for to in range(heads[target], len(moved[target]) + 1):
                    plan = [list(q) for q in moved]
                    plan[target].insert(to, g)
                    out.append(plan)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_queue_scores_sum_to_the_objective(seed: int) -> None:
    table = _table(random_input(seed, num_groups=7, num_instances=3))
    queues = edf_queues(table)
    total = sum(queue_cost(table, q, queue) for q, queue in enumerate(queues))
    assert total == pytest.approx(evaluate(table, queues).objective)


@pytest.mark.parametrize("seed", range(8))
def test_it_never_worsens_a_plan_and_ends_at_a_local_optimum(seed: int) -> None:
    table = _table(random_input(seed, num_groups=6, num_instances=3))
    edf = edf_queues(table)
    better = improve(table, edf, max_moves=1000)
    objective = evaluate(table, better).objective
    assert objective <= evaluate(table, edf).objective * (1 + 1e-12)
    assert sorted(g for q in better for g in q) == list(range(table.num_groups))
    for neighbour in _relocations(table, better):
        assert evaluate(table, neighbour).objective >= objective * (1 - 1e-9)


def test_pinned_groups_keep_their_heads() -> None:
    inp = random_input(3, num_groups=6, num_instances=2)
    pinned = PlanInput(inp.groups, inp.fleet, 0.0, pinned={"i0": ("g0",), "i1": ("g1", "g2")})
    table = _table(pinned)
    better = improve(table, edf_queues(table))
    assert better[0][:1] == [0]
    assert better[1][:2] == [1, 2]


def test_it_finds_the_one_swap_plan_edf_misses() -> None:
    # EDF runs a, b, a and swaps twice; moving the second a group ahead of b swaps once.
    table = _table(one_swap_case())
    edf = edf_queues(table)
    better = improve(table, edf)
    assert [table.groups[g].id for g in better[0]] == ["a1", "a2", "b1"]
    scores = [evaluate(table, q) for q in (edf, better)]
    assert [sum(p.swap_before for p in s.predictions.values()) for s in scores] == [2, 1]
    assert scores[1].objective < scores[0].objective
    assert not any(p.ttft_late_s for p in scores[1].predictions.values())


class _TickingClock(VirtualClock):
    """Each reading advances it by one second: the search's n-th check reads n - 1."""

    def monotonic_s(self) -> float:
        now = super().monotonic_s()
        self.advance_by(1.0)
        return now


@pytest.mark.parametrize("passes", [0, 1, 2, 3])
def test_a_wall_limit_stops_the_search_between_passes(passes: int) -> None:
    table = _table(random_input(2, num_groups=12, num_instances=3))
    edf = edf_queues(table)
    unlimited = [improve(table, edf, max_moves=n) for n in range(4)]
    assert all(unlimited[n] != unlimited[n - 1] for n in (1, 2, 3))  # each pass moves a group
    stopped = improve(table, edf, clock=_TickingClock(), until_s=float(passes))
    assert stopped == unlimited[passes]
