"""The parity benchmark's timing spread: the simulated qlm again with its control loop's
periods 10 % shorter and longer, and whether a live run lies within that range."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.parity_spread import PERTURBATIONS, describe, inside, perturbed, simulated_spread
from qlm.replay.replay_cli import simulate_same
from qlm.sim.scenario import load_scenario


def test_a_perturbation_scales_one_period_and_leaves_the_scenario_as_it_was() -> None:
    scenario = load_scenario(Path("random:4:tiny"))
    before = scenario.qlm.control
    changed = perturbed(scenario, "tick_s", 1.1)
    assert changed.qlm.control.tick_s == pytest.approx(1.1 * before.tick_s)
    assert changed.qlm.control.min_replan_interval_s == before.min_replan_interval_s
    assert scenario.qlm.control == before  # the original is untouched
    assert changed.requests(4) == scenario.requests(4)  # the same requests


def test_the_spread_spans_the_case_and_each_perturbation() -> None:
    scenario = load_scenario(Path("random:4:tiny"))
    spread = simulated_spread(scenario, 4)
    assert spread["runs"] == 1 + len(PERTURBATIONS)
    requests = scenario.requests(4)
    for variant in (scenario, perturbed(scenario, *PERTURBATIONS[1])):
        result = simulate_same(variant, requests, 4, "qlm")
        assert spread["overall_low"] <= result.attainment(None) <= spread["overall_high"]
        assert spread["swaps_low"] <= result.total_swaps <= spread["swaps_high"]
    assert describe(spread).endswith(f"/ {spread['swaps_low']}-{spread['swaps_high']}")
    assert describe(None) == "-"


def case(live: float, swaps: float, spread: dict[str, Any] | None) -> dict[str, Any]:
    return {"live": {"overall": live}, "live_swaps": swaps, "sim_spread": spread}


def test_inside_widens_the_spread_by_the_parity_bounds() -> None:
    spread = {"overall_low": 0.83, "overall_high": 0.90, "swaps_low": 48, "swaps_high": 68}
    assert inside(case(0.912, 48, spread))  # many:5's live run: 1.2 points above the top
    assert not inside(case(0.93, 48, spread))  # 3 points above
    assert not inside(case(0.80, 60, spread))  # 3 points below
    assert inside(case(0.85, 36, spread))  # 25 % below the fewest swaps
    assert not inside(case(0.85, 35, spread))
    assert not inside(case(0.85, 86, spread))  # past 25 % above the most
    assert inside(case(0.85, 1, {**spread, "swaps_low": 0, "swaps_high": 0}))  # one swap
    assert inside(case(0.85, 48, None)) is None


def test_the_docs_block_counts_the_cases_live_inside_the_spread() -> None:
    from benchmarks.parity import render

    def full(name: str, live: float, spread: dict[str, Any] | None) -> dict[str, Any]:
        figures = {"overall": live, "by_class": {}, "swaps": 48, "ttft_p50_s": 1.0,
                   "ttft_p99_s": 2.0, "prediction": {}}  # fmt: skip
        return {
            "case": name, "seed": 5, "speedup": 4.0, "gap_points": {"overall": 7.4},
            "live": figures, "simulated": {**figures, "overall": 0.838}, "live_swaps": 48,
            "live_overall_spread_points": 0.0, "within": False, "faithful": True, "late": [],
            "sim_spread": spread,
        }  # fmt: skip

    spread = {"overall_low": 0.828, "overall_high": 0.908, "swaps_low": 48, "swaps_high": 68,
              "code": "abc1234"}  # fmt: skip
    header = {"command": "x", "date": "d", "machine": "m", "platform": "p", "code": "c"}
    block = render([{**header, "cases": [full("many:5", 0.912, spread), full("b", 0.9, None)]}])
    assert "82.8-90.8 % / 48-68 | yes |" in block
    assert "inside the simulated timing spread on 1 of 1 cases (spreads simulated on code " in block
    assert "abc1234" in block
