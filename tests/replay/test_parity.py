"""Live keeps the promises the simulator predicts: a small two-model burst that needs swaps,
replayed through the public API into an embedded plane on emulated engines (qlm replay), against
`qlm simulate` on the same requests. The full table is benchmarks/parity.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from qlm.replay.replay_cli import ReplayConfig, run_replay
from qlm.sim.scenario import load_scenario

SCENARIO = Path(__file__).with_name("parity-swap.yaml")


@pytest.mark.slow
def test_live_attains_what_the_simulator_predicts_on_a_burst_that_needs_swaps(
    tmp_path: Path,
) -> None:
    scenario = load_scenario(SCENARIO)
    doc = run_replay(scenario, scenario.seed, ReplayConfig(speedup=4.0), tmp_path)
    assert doc is not None
    live, simulated = doc["live"], doc["simulated"]
    assert simulated["swaps"] >= 1  # the case needs swaps (without them: 79.4 %)
    assert live["requests"] == simulated["requests"]
    # One live run on a shared CI machine: 3 points overall (the benchmark's bound is 2, on
    # the median of repeats); one swap or 25 % either way.
    assert abs(doc["gap_points"]["overall"]) <= 3.0, doc["gap_points"]
    assert abs(live["swaps"] - simulated["swaps"]) <= max(1, 0.25 * simulated["swaps"])
    # One wait predictor: the API's forecasts are the simulator's (Dispatcher.predict), so
    # they err alike (here 20.4 % and 20.8 % of batch-1's target; before they were one,
    # the API's plan-table estimate erred by 26-98 %).
    for name, want in simulated["prediction"].items():
        got = live["prediction"][name]
        assert got["requests"] >= 0.9 * want["requests"], (name, got, want)
        gap = got["median_abs_error_of_target"] - want["median_abs_error_of_target"]
        assert abs(gap) <= 0.1, (name, got, want)
