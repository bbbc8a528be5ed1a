"""benchmarks/control_plane/: its pure helpers (arrival schedules, window summaries, target
verdicts, baseline pairing, the docs block), and a smoke run of the admission benchmark against
a real `qlm api` process on a throwaway redis-server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.control_plane import main as cp_main
from benchmarks.control_plane.admission import summarise_admission
from benchmarks.control_plane.engines import engine_steps
from benchmarks.control_plane.load import Samples, arrival_times
from benchmarks.control_plane.overhead import ALONE, BACKLOG, CAPPED, summarise_overhead
from benchmarks.control_plane.render import BEGIN, END, write_docs
from benchmarks.control_plane.streams import StreamSample, summarise_stream
from benchmarks.control_plane.targets import admission_targets, overhead_targets
from tests.redis_server import redis_server_binary


def test_arrival_times_offer_exactly_the_rate_within_the_window() -> None:
    times = arrival_times(500.0, 2.0, seed=3)
    assert len(times) == 1000
    assert times == sorted(times)
    assert times[0] >= 0.0
    assert times[-1] < 2.0
    first_half = sum(t < 1.0 for t in times)
    assert 400 < first_half < 600  # spread over the window, not bunched
    assert arrival_times(500.0, 2.0, seed=3) == times


def samples(rows: list[tuple[float, float, float, bool]]) -> Samples:
    out = Samples()
    for scheduled, sent, done, ok in rows:
        out.scheduled.append(scheduled)
        out.sent.append(sent)
        out.done.append(done)
        out.ok.append(ok)
    return out


def test_admission_summary_counts_only_the_window_and_latency_from_the_schedule() -> None:
    rows = [(0.5, 0.5, 0.501, True)]  # warm-up: left out
    rows += [(1.0 + i / 100, 1.0 + i / 100 + 0.002, 1.0 + i / 100 + 0.004, True) for i in range(99)]
    rows += [(1.995, 1.995, 2.2, False)]  # an error inside the window
    got = summarise_admission(samples(rows), window_start=1.0, window_end=2.0)
    assert got["requests"] == 100
    assert got["accepted"] == 99
    assert got["errors"] == 1
    assert got["p50_ms"] == pytest.approx(4.0)  # scheduled -> answer, not sent -> answer
    assert got["service_p99_ms"] == pytest.approx(2.0)
    assert got["achieved_per_s"] == pytest.approx(99.0)


def test_admission_throughput_stretches_when_answers_come_late() -> None:
    rows = [(1.0 + i / 10, 1.0 + i / 10, 4.0, True) for i in range(10)]  # all answered at 4 s
    got = summarise_admission(samples(rows), window_start=1.0, window_end=2.0)
    assert got["achieved_per_s"] == pytest.approx(10 / 3.0)


def step(
    setup: str, offered: float | None, achieved: float, p99: float, errors: int = 0
) -> dict[str, Any]:
    return {
        "setup": setup,
        "mode": "open" if offered is not None else "closed",
        "offered_per_s": offered,
        "achieved_per_s": achieved,
        "p99_ms": p99,
        "errors": errors,
    }


def test_admission_target_needs_the_rate_sustained_within_the_p99_bound() -> None:
    rows = [
        step("a", 1000.0, 999.0, 3.0),
        step("a", 2000.0, 1995.0, 8.0),
        step("a", 3000.0, 2500.0, 200.0),  # not sustained
        step("a", None, 2600.0, 30.0),  # closed loop: reported, never the verdict
        step("b", 1000.0, 1000.0, 4.0),
        step("b", 2000.0, 2000.0, 12.0),  # sustained, but p99 too high
        step("c", 2000.0, 2000.0, 2.0, errors=3),  # errors
    ]
    verdicts = {r["subject"]: r for r in admission_targets(rows)}
    assert verdicts["a"]["result"] == "PASS"
    assert verdicts["a"]["measured"] == (
        "1,995 req/s at p99 8.0 ms; closed loop 2,600 req/s (p99 30 ms)"
    )
    assert verdicts["b"]["result"] == "MISS"
    assert verdicts["b"]["measured"] == (
        "1,000 req/s at p99 4.0 ms; sustained 2,000 req/s at p99 12 ms"
    )
    assert verdicts["c"]["result"] == "MISS"
    assert verdicts["c"]["measured"] == "p99 bound met at no step"


def test_knee_and_scaling_targets_read_the_knee_steps_and_the_closed_loops() -> None:
    """p99 at 80 % of each setup's closed-loop rate; saturation rising from one API process
    to two (the closed loops)."""
    rows = [
        step("api x1", None, 4000.0, 14.0),
        step("api x1", 3200.0, 3190.0, 19.5) | {"mode": "knee"},
        step("api x2", None, 3900.0, 9.0),
        step("api x2", 3120.0, 3100.0, 35.0) | {"mode": "knee"},
    ]
    knee = [r for r in admission_targets(rows) if r["target"].startswith("p99 <= 20 ms at 80%")]
    assert [(r["subject"], r["result"]) for r in knee] == [("api x1", "PASS"), ("api x2", "MISS")]
    assert knee[0]["measured"] == "p99 19.5 ms at 3,190 of 4,000 req/s"
    (scaling,) = [r for r in admission_targets(rows) if r["subject"] == "api x1 -> x2"]
    assert (scaling["result"], scaling["measured"]) == ("MISS", "4,000 -> 3,900 req/s (0.97x)")


def run(variant: str, workload: str, tokens_per_s: float, ttft_ms: list[float]) -> dict[str, Any]:
    return {
        "variant": variant,
        "workload": workload,
        "ok": len(ttft_ms),
        "requests": len(ttft_ms),
        "tokens_per_s": tokens_per_s,
        "ttft_ms": ttft_ms,
        "e2e_p50_ms": 100.0,
        "qlm_cpu_cores": 0.1,
        "qlm_cpu_ms_per_req": 2.0,
        "qlm_runq_wait_share": 0.1,
        "vllm_cpu_cores": 1.0,
        "prompt_tokens_mean": 33.0,
    }


def test_overhead_compares_qlm_with_the_vllm_run_beside_it() -> None:
    runs = [
        run(ALONE, "burst", 2000.0, [50.0, 60.0, 70.0]),
        run("vLLM beside QLM memory", "burst", 1000.0, [100.0, 110.0, 120.0]),
        run("vLLM beside QLM memory", "burst", 1200.0, [100.0, 110.0, 120.0]),
        run("QLM memory", "burst", 960.0, [115.0, 125.0, 135.0]),
        run("QLM memory", "burst", 1000.0, [115.0, 125.0, 135.0]),
        run(f"{CAPPED} 16 beside QLM memory", "burst", 1045.0, [90.0, 95.0, 100.0]),
    ]
    rows = {r["variant"]: r for r in summarise_overhead(runs)}
    capped = rows[f"{CAPPED} 16 beside QLM memory"]  # against the uncapped client
    assert capped["baseline"] == "vLLM beside QLM memory"
    assert capped["throughput_ratio"] == pytest.approx(1045.0 / 1100.0)
    qlm = rows["QLM memory"]
    assert qlm["baseline"] == "vLLM beside QLM memory"
    assert qlm["throughput_ratio"] == pytest.approx(980.0 / 1100.0)
    assert qlm["added_ttft_p50_ms"] == pytest.approx(15.0)
    assert rows["vLLM beside QLM memory"]["baseline"] == ALONE
    assert rows[ALONE]["baseline"] is None
    verdicts = overhead_targets(list(rows.values()))
    # 0.89 < 0.95; +15 ms <= 20; the runs' qlm CPU per request (run()'s) within 2 ms
    assert [v["result"] for v in verdicts] == ["MISS", "PASS", "PASS"]


def test_an_engine_backlog_sweep_shares_one_baseline_and_sets_no_verdict() -> None:
    runs = [
        run(f"vLLM beside {BACKLOG}s", "burst", 1000.0, [100.0]),
        run(f"{BACKLOG} auto", "burst", 800.0, [120.0]),
        run(f"{BACKLOG} 16", "burst", 900.0, [110.0]),
    ]
    rows = {r["variant"]: r for r in summarise_overhead(runs)}
    assert rows[f"{BACKLOG} auto"]["throughput_ratio"] == pytest.approx(0.8)
    assert rows[f"{BACKLOG} 16"]["throughput_ratio"] == pytest.approx(0.9)
    assert rows[f"{BACKLOG} 16"]["added_ttft_p50_ms"] == pytest.approx(10.0)
    assert overhead_targets(list(rows.values())) == []  # a diagnosis, not the product's target


def test_a_burst_s_makespan_splits_at_its_first_token_and_first_submit() -> None:
    samples = [  # sent, first token, done (monotonic s); the first send is at 10.0
        StreamSample(10.0, 10.30, 10.9, 32, 33),
        StreamSample(10.05, 10.12, 10.5, 32, 33),
        StreamSample(10.02, None, 10.2, 0, 0, error="http 500"),
    ]
    summary = summarise_stream(samples)
    assert summary["makespan_s"] == pytest.approx(0.9)
    assert summary["first_token_ms"] == pytest.approx(120.0)
    runs = [
        run("QLM memory", "burst", 960.0, [1.0]) | {"makespan_s": 0.9, "qlm_first_submit_ms": 80},
        run("QLM memory", "burst", 990.0, [1.0]) | {"makespan_s": 0.7, "qlm_first_submit_ms": 60},
        run("QLM memory", "burst", 999.0, [1.0]) | {"makespan_s": 0.8},  # no records read
    ]
    (row,) = summarise_overhead(runs)
    assert row["makespan_s"] == pytest.approx(0.8)
    assert row["qlm_first_submit_ms"] == pytest.approx(70.0)
    assert row["first_token_ms"] is None  # no run had one


METRICS_TEXT = """\
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="tiny-a"} 3.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="tiny-a"} 129.0
vllm:iteration_tokens_total_count{engine="0",model_name="tiny-a"} 129.0
vllm:iteration_tokens_total_sum{engine="0",model_name="tiny-a"} 4171.0
vllm:iteration_tokens_total_count{engine="1",model_name="tiny-a"} 11.0
vllm:iteration_tokens_total_sum{engine="1",model_name="tiny-a"} 40.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-a"} 0.0
"""


def test_engine_steps_are_the_iteration_histogram_s_count_over_engines() -> None:
    assert engine_steps(METRICS_TEXT) == 140.0  # 129 + 11: counts, not buckets or sums
    assert engine_steps("# TYPE other gauge\nother 1.0\n") is None
    runs = [
        run("QLM memory", "burst", 960.0, [1.0]) | {"vllm_steps": 150.0},
        run("QLM memory", "burst", 990.0, [1.0]) | {"vllm_steps": 140.0},
        run("QLM memory", "burst", 999.0, [1.0]) | {"vllm_steps": None},  # not exported
    ]
    (row,) = summarise_overhead(runs)
    assert row["vllm_steps"] == pytest.approx(145.0)


def test_docs_block_is_replaced_and_other_blocks_stay(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\n<!-- solver:begin -->\nsolver\n<!-- solver:end -->\n")
    write_docs("first", docs)
    write_docs("second", docs)
    text = docs.read_text()
    assert "<!-- solver:begin -->\nsolver\n<!-- solver:end -->" in text
    assert text.count(BEGIN) == 1
    assert f"{BEGIN}\nsecond\n{END}" in text
    assert "first" not in text


@pytest.mark.benchmark
@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_admission_run_against_a_real_api_process(tmp_path: Path) -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    out = tmp_path / "control_plane.json"
    argv = ["--quick", "--skip-vllm", "--setups", "api x1", "--rates", "100"]
    cp_main.main([*argv, "--duration", "1", "--clients", "1", "--out", str(out), "--no-docs"])
    report = json.loads(out.read_text())
    rows = report["admission"]["rows"]
    modes = [(r["setup"], r["mode"]) for r in rows]
    assert modes == [("api x1", "open"), ("api x1", "closed"), ("api x1", "knee")]
    assert rows[2]["offered_per_s"] == pytest.approx(0.8 * rows[1]["achieved_per_s"])
    for row in rows:
        assert "error" not in row, row
        assert row["accepted"] > 0
        assert row["errors"] == 0
        assert set(row["statuses"]) == {"202"}
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
        assert row["cpu_api_us_per_req"] > 0
    assert rows[0]["accepted"] == pytest.approx(100, abs=2)  # 100/s for 1 s, all accepted
    assert [t["subject"] for t in report["targets"]] == ["api x1", "api x1"]


def test_a_partial_run_keeps_the_skipped_section_with_its_own_provenance(tmp_path: Path) -> None:
    earlier: dict[str, Any] = {"command": "full", "date": "d1", "code": "c1"}
    earlier |= {"admission": {"rows": [1]}}
    earlier |= {"overhead": {"summary": []}, "loadavg_before": [1], "loadavg_after": [2]}
    previous = tmp_path / "control_plane.json"
    previous.write_text(json.dumps(earlier))
    now = {"command": "--skip-admission", "date": "d2", "code": "c2", "overhead": {"summary": [3]}}
    merged = cp_main._with_skipped_sections(now, previous)
    assert merged["admission"]["rows"] == [1]
    assert merged["admission"]["measured"]["command"] == "full"
    assert merged["overhead"]["summary"] == [3]
    assert merged["overhead"]["measured"]["date"] == "d2"
    assert cp_main._with_skipped_sections(now, tmp_path / "missing.json") == now
