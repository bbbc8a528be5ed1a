"""benchmarks/queue_round_trips.py end to end, small: a real `qlm serve` on each queue, the
openai client streaming through it, and the counts the block reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import queue_round_trips

pytestmark = pytest.mark.redis


def test_the_benchmark_counts_each_queue_s_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "rt.json"
    argv = ["--requests", "6", "--rate", "30", "--rounds", "1", "--no-docs", "--out", str(out)]
    assert queue_round_trips.main(argv) == 0
    runs = json.loads(out.read_text())["runs"]
    memory, on_redis = runs["this checkout / memory"][0], runs["this checkout / redis"][0]
    for run in (memory, on_redis):
        assert run["chunks_per_req"] >= 2  # a stream, not one answer
        assert run["qlm_syscalls_per_req"] > 0
        assert run["qlm_cpu_ms_per_req"] > 0
    assert memory["redis_commands_per_req"] == 0
    assert on_redis["redis_commands_per_req"] > 5  # enqueue, pull, emit, finish at least
    # Redis adds its round trips to the ones a memory plane makes with its clients
    assert on_redis["qlm_syscalls_per_req"] > memory["qlm_syscalls_per_req"]
