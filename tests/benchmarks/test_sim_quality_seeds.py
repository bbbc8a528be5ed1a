"""sim_quality.py --seeds: the verdict per scenario and seed, on made-up summaries."""

from __future__ import annotations

from typing import Any

from benchmarks.sim_quality.seeds import verdict


def _summary(overall: float, batch: float, thr: float) -> dict[str, Any]:
    return {
        "slo_attainment": {"overall": overall, "interactive": overall, "batch-1": batch},
        "throughput_rps": thr,
    }


def _entry(qlm: dict[str, Any], **bases: dict[str, Any]) -> dict[str, Any]:
    defaults = {b: _summary(0.5, 0.5, 10.0) for b in ("fcfs", "edf", "shepherd", "llmd")}
    return {"policies": {"qlm": qlm, **defaults, **bases}}


def test_verdict_passes_a_policy_that_wins_everywhere() -> None:
    v = verdict(_entry(_summary(0.9, 0.9, 10.0)))
    assert v["overall_ok"]
    assert v["classes_ok"]
    assert v["throughput_ok"]
    assert abs(v["overall_margin_pts"] - 40.0) < 1e-9


def test_verdict_names_each_way_qlm_falls_short() -> None:
    v = verdict(_entry(_summary(0.9, 0.6, 9.0), fcfs=_summary(0.8, 0.7, 10.0)))
    assert v["overall_ok"]
    assert not v["classes_ok"]  # batch-1 10 points below fcfs's
    assert v["worst_class"] == "batch-1"
    assert v["class_margins"]["batch-1"]["best"] == "fcfs"
    assert not v["throughput_ok"]  # 0.9 of the best
    behind = verdict(_entry(_summary(0.7, 0.7, 10.0), llmd=_summary(0.75, 0.5, 10.0)))
    assert not behind["overall_ok"]
    assert behind["overall_best"] == "llmd"


def test_verdict_reports_missing_runs() -> None:
    entry = _entry(_summary(0.9, 0.9, 10.0))
    del entry["policies"]["llmd"]
    assert verdict(entry) == {"missing": ["llmd"]}
