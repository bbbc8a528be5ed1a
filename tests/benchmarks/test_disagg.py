"""benchmarks/disagg.py: the splits it runs and the row of the planner's split."""

from __future__ import annotations

from pathlib import Path

from benchmarks.disagg import planner_split, splits
from qlm.sim.scenario import load_scenario
from qlm.types import InstanceRole

SIMS = Path(__file__).resolve().parents[2] / "sims"


def test_every_split_by_gpu_type_has_both_roles_and_names_its_counts() -> None:
    scenario = load_scenario(SIMS / "wc-quick.yaml")  # 2 A10 + 3 A100
    named = dict(splits(scenario.fleet()))
    assert len(named) == 3 * 4 - 2  # (0..2) x (0..3) prefill counts, less all and none
    fleet = named["A10 1P1D + A100 2P1D"]
    roles = [(i.gpu_type, i.role) for i in fleet.instances]
    assert roles.count(("A10", InstanceRole.PREFILL)) == 1
    assert roles.count(("A100", InstanceRole.PREFILL)) == 2
    assert roles.count(("A100", InstanceRole.DECODE)) == 1
    assert all(
        {i.role for i in f.instances} == {InstanceRole.PREFILL, InstanceRole.DECODE}
        for f in named.values()
    )


def test_the_planner_s_split_is_one_of_the_splits_run() -> None:
    scenario = load_scenario(SIMS / "mooncake-quick.yaml")
    fleet = scenario.fleet()
    chosen = planner_split(scenario.requests(0), fleet)
    assert chosen in dict(splits(fleet))
