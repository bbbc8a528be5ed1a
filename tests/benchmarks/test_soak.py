"""benchmarks/soak/: its pure helpers (memory slope and verdict, the docs rows) and a --quick
run of benchmarks/soak/ against real `qlm api|controller|agent` processes on a throwaway
Redis."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.soak.memory import memory_rows, memory_summary, slope_mib_per_hour
from benchmarks.soak.summary import verdict
from tests.redis_server import redis_server_binary

ROOT = Path(__file__).resolve().parents[2]


def test_slope_is_per_hour_and_zero_for_flat_or_short_series() -> None:
    times = [0.0, 60.0, 120.0, 180.0]
    assert slope_mib_per_hour(times, [100.0, 101.0, 102.0, 103.0]) == pytest.approx(60.0)
    assert slope_mib_per_hour(times, [100.0] * 4) == 0.0
    assert slope_mib_per_hour([5.0], [1.0]) == 0.0


def samples(values: list[float], every_s: float = 10.0) -> list[dict[str, Any]]:
    return [{"t_s": k * every_s, "api": v} for k, v in enumerate(values)]


def test_memory_summary_leaves_out_the_warm_up_and_flags_growth() -> None:
    warm_then_flat = samples([50.0, 150.0] + [200.0] * 8)  # grows only while warming up
    flat = memory_summary(warm_then_flat, duration_s=100.0)["api"]
    assert flat["flat"]
    assert flat["start_mib"] == 50.0
    assert flat["after_warmup_mib"] == 200.0
    assert flat["slope_mib_per_hour"] == 0.0
    leaking = memory_summary(samples([200.0 + 3.0 * k for k in range(10)]), 100.0)["api"]
    assert not leaking["flat"]  # 3 MiB per 10 s: about 21 MiB over the measured part
    assert leaking["slope_mib_per_hour"] == pytest.approx(1080.0)


def test_memory_rows_keep_first_and_last_sample() -> None:
    rows = memory_rows(samples([float(v) for v in range(100)]), rows=11)
    assert len(rows) == 11
    assert rows[0]["t_s"] == 0.0
    assert rows[-1]["t_s"] == 990.0


def test_verdict_allows_only_429_and_needs_every_accepted_request_completed() -> None:
    memory = {"api": {"flat": True}}
    good = {
        "errors": {"HTTP 429 [batch-2]": 7},
        "transport_errors": 0,
        "final_counts": {"completed": 10, "failed": 0, "cancelled": 0, "queued": 0},
        "accepted_total": 10,
        "memory": memory,
    }
    assert verdict(good) == {
        "memory_flat": True,
        "unexpected_errors": 0,
        "all_accepted_completed": True,
    }
    bad = {**good, "errors": {"HTTP 429 [batch-1]": 1, "HTTP 500 [interactive]": 2}}
    assert verdict(bad)["unexpected_errors"] == 2
    short = {**good, "final_counts": {"completed": 9, "failed": 1, "cancelled": 0}}
    assert not verdict(short)["all_accepted_completed"]
    stuck = {**good, "final_counts": {"completed": 10, "queued": 1}}
    assert not verdict(stuck)["all_accepted_completed"]
    # the plane completed one request whose answer the client lost to a transport error
    unanswered = {**good, "final_counts": {"completed": 11}, "transport_errors": 1}
    assert verdict(unanswered)["all_accepted_completed"]
    assert not verdict({**unanswered, "transport_errors": 0})["all_accepted_completed"]
    redis_grows = {**good, "memory": {"api": {"flat": True}, "redis-server": {"flat": False}}}
    assert verdict(redis_grows)["memory_flat"]  # retention of finished requests
    api_grows = {**good, "memory": {"api": {"flat": False}}}
    assert not verdict(api_grows)["memory_flat"]


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_soak_runs_and_reports(tmp_path: Path) -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    out = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.exists(), done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["memory"]) == {"api", "controller", "agent", "redis-server"}
    assert len(report["memory_samples"]) >= 5
    assert all(m["end_mib"] > 0 for m in report["memory"].values())
    assert all("in_flight_peak" in row for row in report["memory_samples"])
    assert report["accepted_total"] > 0
    assert report["enqueue_latency"]["n"] > 0
    assert report["verdict"]["unexpected_errors"] == 0, report["errors"]
    assert report["verdict"]["all_accepted_completed"], report["final_counts"]
    assert "## Soak" in done.stdout
