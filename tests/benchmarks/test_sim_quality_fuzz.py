"""sim_quality.py --random: qlm's margin over the best baseline, its distribution and the
rendered block, on made-up results (no simulation)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.sim_quality.fuzz import distribution, margin_pts, qlm_cost_lines, render


def _policies(**overall: float) -> dict[str, Any]:
    return {
        p: {"slo_attainment": {"overall": v}, "code": "abc", "date": "2026-01-01T00:00:00"}
        for p, v in overall.items()
    }


def test_margin_against_the_best_baseline() -> None:
    assert margin_pts(_policies(fcfs=0.5, edf=0.9, qlm=0.85)) == pytest.approx(-5.0)
    assert margin_pts(_policies(fcfs=0.5, qlm=0.7)) == pytest.approx(20.0)
    assert margin_pts(_policies(fcfs=0.5)) is None


def test_distribution() -> None:
    dist = distribution([-10.0, -2.0, 0.0, 1.0, 3.0])
    assert dist["min_pts"] == -10.0
    assert dist["median_pts"] == 0.0
    assert dist["share_at_least_-1_pt"] == pytest.approx(0.6)
    assert dist["count_below_-5_pts"] == 1
    assert distribution([]) == {"scenarios": 0}


def test_render_lists_the_worst_case_first() -> None:
    scenarios = {
        f"random:{seed}": {
            "seed": seed,
            "description": f"fleet {seed}",
            "streams": "s",
            "requests": 100,
            "policies": _policies(fcfs=0.8, qlm=q),
            "timeouts": {},
            "qlm_margin_pts": 100.0 * (q - 0.8),
        }
        for seed, q in ((0, 0.9), (1, 0.5))
    }
    block = render({"commands": ["x"], "machine": "m", "scenarios": scenarios})
    assert "| 1 | fleet 1 | 100 | 80.0% | 50.0% | - | -30.0 | fcfs |" in block  # no bound kept
    worst = block.split("Worst cases")[1]
    assert worst.index("seed 1") < worst.index("seed 0")


def test_the_many_model_family_counts_the_swapping_baselines() -> None:
    from benchmarks.sim_quality.fuzz import FAMILIES

    many = FAMILIES["many"].baselines
    policies = _policies(fcfs=0.5, serverless=0.8, qlm=0.7)
    assert margin_pts(policies, many) == pytest.approx(-10.0)
    assert margin_pts(policies) == pytest.approx(20.0)  # the random family's baselines
    scenarios = {
        "many:0": {
            "seed": 0,
            "description": "fleet",
            "streams": "s",
            "requests": 100,
            "policies": policies,
            "timeouts": {},
            "qlm_margin_pts": -10.0,
        }
    }
    block = render({"family": "many", "commands": ["x"], "machine": "m", "scenarios": scenarios})
    assert "many models, few GPUs" in block
    assert "| -10.0 | serverless |" in block


def test_the_bound_column_and_qlm_s_mean_distance_below_it() -> None:
    def entry(bound: float, qlm: float) -> dict[str, Any]:
        policies = _policies(fcfs=0.5, qlm=qlm)
        return {
            "seed": 0,
            "description": "f",
            "streams": "s",
            "requests": 10,
            "policies": policies,
            "timeouts": {},
            "qlm_margin_pts": 0.0,
            "bound_pct": bound,
        }

    scenarios = {
        "many:1": entry(99.0, 0.69),
        "many:2": entry(90.0, 0.85),
        "many:3": entry(80.0, 0.8),
    }
    block = render({"family": "many", "commands": ["x"], "machine": "m", "scenarios": scenarios})
    assert "| 99.0% | +0.0 |" in block
    assert (
        "no swaps): mean 11.7 pts over 3 scenarios, at most 30.0 (many:1), at least 0.0 "
        "(many:3)." in block
    )


def test_the_planner_cost_line_names_the_worst_scenario_per_request() -> None:
    def entry(requests: int, planner_s: float, sim_s: float) -> dict[str, Any]:
        qlm = {"requests": requests, "planner_wall_s": planner_s, "sim_wall_s": sim_s}
        return {"policies": {"qlm": qlm, "fcfs": {"requests": requests}}}

    lines = qlm_cost_lines(
        {
            "many:1": entry(1000, 2.0, 3.0),
            "many:2": entry(500, 2.0, 9.0),
            "many:3": {"policies": {}},
        }
    )
    assert lines[1] == (
        "qlm's planner: median 3.0 ms of wall time per request over 2 scenarios, at most 4.0 ms "
        "(many:2); its longest run took 9.0 s (many:2)."
    )
    assert qlm_cost_lines({"many:1": {"policies": {"qlm": {"requests": 5}}}}) == []


def test_the_many_model_family_runs_its_shipped_scenario_at_each_seed() -> None:
    from benchmarks.sim_quality.fuzz import RandomRun, run

    spec = RandomRun(range(0), ["fcfs"], jobs=1, limit_s=None, command="x", family="many")
    doc = run(spec)
    assert list(doc["scenarios"]) == ["many-quick@0", "many-quick@1", "many-quick@7"]
    runs = [doc["scenarios"][f"many-quick@{seed}"] for seed in (0, 1, 7)]
    assert [r["seed"] for r in runs] == [0, 1, 7]
    counts = [r["policies"]["fcfs"]["requests"] for r in runs]
    assert counts == [r["requests"] for r in runs]  # each run drew its own seed's requests
    assert len(set(counts)) == 3
    # each at its own seed's bound: an upper bound on what fcfs keeps
    assert all(  # bound_pct is rounded to 2 decimals
        r["policies"]["fcfs"]["slo_attainment"]["overall"] * 100 <= r["bound_pct"] + 0.005
        for r in runs
    )
