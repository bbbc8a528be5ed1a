"""The parity benchmark's arithmetic: a case's bounds (overall, every class, swaps) and the docs
block merged from several results files, a later file's case replacing an earlier one's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import parity
from benchmarks.parity import render, within

HEADER = {"command": "x", "date": "d", "machine": "m", "platform": "p", "code": "c"}


def figures(overall: float, swaps: int) -> dict[str, Any]:
    return {
        "overall": overall, "by_class": {}, "swaps": swaps, "ttft_p50_s": 1.0,
        "ttft_p99_s": 2.0, "prediction": {},
    }  # fmt: skip


def case(name: str, gap: dict[str, float], live_swaps: float, sim_swaps: int) -> dict[str, Any]:
    return {
        "case": name, "seed": 0, "speedup": 4.0, "gap_points": gap,
        "live": figures(0.9, int(live_swaps)), "simulated": figures(0.9, sim_swaps),
        "live_swaps": live_swaps, "live_overall_spread_points": 0.0,
    }  # fmt: skip


def test_bounds_hold_overall_in_every_class_and_on_swaps() -> None:
    assert within(case("a", {"overall": 1.9, "x": -2.9}, 4, 4))
    assert not within(case("a", {"overall": 2.1, "x": 0.0}, 4, 4))
    assert not within(case("a", {"overall": 0.0, "x": 3.1}, 4, 4))
    assert within(case("a", {"overall": 0.0}, 5, 4))  # one swap either way
    assert not within(case("a", {"overall": 0.0}, 14, 10))  # past 25 %
    assert within(case("a", {"overall": 0.0}, 12, 10))


def test_a_later_results_file_replaces_the_same_case() -> None:
    first = {**HEADER, "cases": [case("wc-quick", {"overall": -20.0}, 0, 0)]}
    first["cases"][0]["within"] = False
    again = {**HEADER, "cases": [case("wc-quick", {"overall": -1.0}, 0, 0)]}
    again["cases"][0]["within"] = True
    block = render([first, again])
    assert "-1.0" in block
    assert "-20.0" not in block
    assert "1 of 1 cases within bounds" in block


def test_a_replay_that_lost_the_arrival_times_is_never_within_bounds() -> None:
    late = {**case("wc-quick", {"overall": 0.5}, 0, 0), "faithful": False, "late": ["batch-1"]}
    assert not within(late)  # a small gap on another workload measures nothing
    late["within"] = within(late)
    late["live"] |= {"client_errors": 0.0, "arrival_lag_p99_s": {"batch-1": 18.4, "x": 1.0}}
    kept = {**case("wb-quick", {"overall": 0.5}, 0, 0), "faithful": True, "late": []}
    kept["within"] = within(kept)
    block = render([{**HEADER, "cases": [late, kept]}])
    assert "0 / 18.4 s / NO: batch-1" in block
    assert "1 of 2 cases within bounds; 1 replays not faithful" in block


def test_repeats_run_in_rounds_and_the_median_repeat_is_the_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[tuple[str, int]] = []
    overalls = {("wb-quick", 0): [0.95, 0.90, 0.97], ("wc-quick", 0): [0.99, 0.98, 0.98]}

    def replay(name: str, seed: int, repeat: int, *_: Any) -> dict[str, Any]:
        order.append((name, repeat))
        live = figures(overalls[name, seed][repeat], 4)
        sim = figures(0.96, 4)
        gap = {"overall": 100 * (live["overall"] - 0.96)}
        return {"live": live | {"requests": 10}, "simulated": sim, "gap_points": gap,
                "replay": {"faithful": True, "late": []}, "speedup": 4.0}  # fmt: skip

    monkeypatch.setattr(parity, "replay_once", replay)
    monkeypatch.setattr(parity, "simulated_baselines", lambda *_: {"fcfs": 0.5})
    spread = {"overall_low": 0.9, "overall_high": 0.97, "swaps_low": 3, "swaps_high": 5}
    monkeypatch.setattr(parity, "simulated_spread", lambda *_: spread)
    out = tmp_path / "parity.json"
    argv = ["--quick", "wb-quick", "wc-quick", "--seeds", "0", "--random", "0", "--repeats", "3"]
    assert parity.main([*argv, "--results", str(out), "--no-docs"]) == 0
    # every case once, then again: a case's repeats are spread over the run
    assert order == [(n, r) for r in range(3) for n in ("wb-quick", "wc-quick")]
    report = json.loads(out.read_text())
    assert "partial" not in report
    cases = {c["case"]: c for c in report["cases"]}
    assert cases["wb-quick"]["live"]["overall"] == 0.95  # the median of 0.90, 0.95, 0.97
    assert cases["wb-quick"]["live_overall_spread_points"] == pytest.approx(7.0)
    assert cases["wb-quick"]["within"]
