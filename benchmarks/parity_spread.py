"""How far the simulated `qlm` moves when nothing changes but the moments its control loop runs.

A parity case compares one live replay with one simulation; the live plane's re-plans never
fall at exactly the simulator's instants (its loop wakes on the wall clock, its planner's
solve time varies). Where the policy's outcome depends on those instants, live and simulated
differ by that much even though both planes decide by the same rules. `simulated_spread`
measures it: the case simulated again with the control loop's `tick_s` and
`min_replan_interval_s` each 10 % shorter and 10 % longer (four more deterministic runs), and
the range of overall attainment and swaps over the five. A gap inside that range is the
decision's own sensitivity to timing; one outside it is a difference between the planes.

Measured on many:5 (2026-12-01, code 7849e2e, by `qlm simulate` on scenario files with the
periods changed): 82.8 % to 90.8 % overall and 48 to 68 swaps over the five runs; the live
replay of the same requests 91.2 % with 48 swaps.
"""

from __future__ import annotations

from typing import Any

from qlm.replay.replay_cli import simulate_same
from qlm.sim.result import SimResult
from qlm.sim.scenario import Scenario

# The parity bounds (benchmarks/parity.py `within`): attainment points overall and per class,
# and swaps within this share of the simulated count or one swap (`swap_slack`).
OVERALL_POINTS, CLASS_POINTS, SWAP_SHARE = 2.0, 3.0, 0.25
# (control field, factor): each simulated once more with that one field scaled
PERTURBATIONS: tuple[tuple[str, float], ...] = (
    ("tick_s", 0.9),
    ("tick_s", 1.1),
    ("min_replan_interval_s", 0.9),
    ("min_replan_interval_s", 1.1),
)


def swap_slack(swaps: float) -> float:
    """How many swaps either way a live run may differ by from `swaps` simulated."""
    return max(1.0, SWAP_SHARE * swaps)


def perturbed(scenario: Scenario, field: str, factor: float) -> Scenario:
    """The scenario with one control-loop period scaled by `factor`."""
    control = scenario.qlm.control
    changed = control.model_copy(update={field: getattr(control, field) * factor})
    qlm = scenario.qlm.model_copy(update={"control": changed})
    return scenario.model_copy(update={"qlm": qlm})


def timing_runs(scenario: Scenario, seed: int) -> list[SimResult]:
    """`qlm` on the scenario's requests as given and with each timing perturbation."""
    requests = scenario.requests(seed)
    variants = (scenario, *(perturbed(scenario, f, k) for f, k in PERTURBATIONS))
    return [simulate_same(variant, requests, seed, "qlm") for variant in variants]


def simulated_spread(scenario: Scenario, seed: int) -> dict[str, Any]:
    """The lowest and highest overall attainment and swaps of `qlm` over the scenario as
    given and its four timing perturbations, on the same requests."""
    runs = timing_runs(scenario, seed)
    overall = [result.attainment(None) for result in runs]
    swaps = [result.total_swaps for result in runs]
    return {
        "overall_low": min(overall),
        "overall_high": max(overall),
        "swaps_low": min(swaps),
        "swaps_high": max(swaps),
        "runs": len(overall),
    }


def describe(spread: dict[str, Any] | None) -> str:
    """'low-high % / low-high swaps', or '-' when not measured."""
    if not spread:
        return "-"
    low, high = 100 * spread["overall_low"], 100 * spread["overall_high"]
    return f"{low:.1f}-{high:.1f} % / {spread['swaps_low']}-{spread['swaps_high']}"


def inside(case: dict[str, Any]) -> bool | None:
    """Whether the live median run's overall attainment and swaps lie within the simulated
    spread widened by the parity bounds (2 points, 25 % of swaps or one); None when the
    spread was not measured."""
    spread = case.get("sim_spread")
    if not spread:
        return None
    live, margin = case["live"]["overall"], OVERALL_POINTS / 100
    ok_overall = spread["overall_low"] - margin <= live <= spread["overall_high"] + margin
    low, high = spread["swaps_low"], spread["swaps_high"]
    swaps = case["live_swaps"]
    ok_swaps = low - swap_slack(low) <= swaps <= high + swap_slack(high)
    return ok_overall and ok_swaps
