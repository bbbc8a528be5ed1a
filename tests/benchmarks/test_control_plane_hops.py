"""benchmarks/control_plane/hops.py: which hop a sampled stack belongs to, the split of a
run's CPU by pooled samples, the CPU target, and py-spy really sampling a process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks.control_plane.hops import HopSampler, hop_counts, hop_of, hop_rows, py_spy
from benchmarks.control_plane.targets import overhead_targets

ROOT = [
    "<module> (<string>:1)",
    "_serve (qlm/serve/serve_cli.py:80)",  # the plane's own root frames name no hop
    "run (uvloop/__init__.py:82)",
    "Runner.run (asyncio/runners.py:118)",
]
API = ["RequestResponseCycle.run_asgi (uvicorn/protocols/http/httptools_impl.py:409)"]


def test_a_stack_belongs_to_the_first_hop_its_task_frames_name() -> None:
    enqueue = [
        *ROOT,
        *API,
        "ApiContext.admit (qlm/api/context.py:90)",
        "enqueue (qlm/queue/memory.py:99)",
    ]
    assert hop_of(enqueue) == "queue"  # a queue write counts as the queue's, whoever calls it
    assert hop_of([*ROOT, *API, "ApiContext.admit (qlm/api/context.py:90)"]) == "admission"
    sse = [*ROOT, *API, "SseResponse.__call__ (qlm/api/streaming.py:330)", "send (x.py:1)"]
    assert hop_of(sse) == "token streaming"
    assert hop_of([*ROOT, "Agent.run (qlm/agents/agent.py:120)"]) == "agent"
    assert hop_of([*ROOT, "ControlLoop.run (qlm/serve/loop.py:60)"]) == "control loop"
    vllm = [*ROOT, "RequestStreams._stream (qlm/engine/vllm/request_streams.py:99)"]
    assert hop_of(vllm) == "engine client"
    assert hop_of([*ROOT, "Logger.info (logging/__init__.py:1)"]) == "other"


def test_idle_stacks_are_not_counted() -> None:
    assert hop_of(ROOT) is None  # uvloop waiting in epoll: no Python frame above the loop
    pool = ["Thread.run (threading.py:982)", "_worker (concurrent/futures/thread.py:81)"]
    assert hop_of(pool) is None
    assert hop_of(["Thread.run (threading.py:982)", "Condition.wait (threading.py:320)"]) is None


def test_raw_lines_count_samples_per_hop() -> None:
    lines = [
        ";".join([*ROOT, "Agent.run (qlm/agents/agent.py:120)"]) + " 7",
        ";".join(ROOT) + " 50",
        ";".join([*ROOT, *API, "ApiContext.admit (qlm/api/context.py:90)"]) + " 3",
        "garbage",
    ]
    assert dict(hop_counts(lines)) == {"agent": 7, "admission": 3}


def test_hop_rows_split_the_median_cpu_by_pooled_shares() -> None:
    def run(cpu: float, samples: dict[str, int]) -> dict[str, object]:
        return {
            "variant": "QLM memory",
            "workload": "burst",
            "ok": 64,
            "qlm_cpu_ms_per_req": cpu,
            "hop_samples": samples,
        }

    runs = [run(2.0, {"agent": 10, "queue": 10}), run(4.0, {"agent": 20}), run(3.0, {})]
    (row,) = hop_rows(runs)
    assert row["samples"] == 40
    assert row["qlm_cpu_ms_per_req"] == 3.0  # median of the runs that have samples: 2, 4
    assert row["agent"] == 3.0 * 30 / 40
    assert row["queue"] == 3.0 * 10 / 40
    assert row["admission"] == 0.0


def test_cpu_target_per_queue_kind() -> None:
    def row(variant: str, cpu: float) -> dict[str, object]:
        return {
            "variant": variant,
            "workload": "burst",
            "throughput_ratio": 1.0,
            "added_ttft_p50_ms": 1.0,
            "qlm_cpu_ms_per_req": cpu,
        }

    targets = overhead_targets([row("QLM memory", 2.5), row("QLM redis", 3.5)])
    cpu = [t for t in targets if t["target"].startswith("qlm CPU")]
    assert [(t["subject"], t["result"]) for t in cpu] == [
        ("QLM memory, burst", "MISS"),
        ("QLM redis, burst", "PASS"),
    ]


def test_py_spy_samples_a_running_process() -> None:
    assert py_spy() is not None, "py-spy is a pinned dev dependency"
    busy = "import time\ndef spin():\n    while True: sum(range(1000))\nspin()"
    proc = subprocess.Popen([sys.executable, "-c", busy])
    try:
        time.sleep(0.5)
        with HopSampler([proc.pid]) as sampler:
            time.sleep(1.0)
    finally:
        proc.kill()
        proc.wait()
    if not sampler.counts and any("ermission" in e for e in sampler.errors):
        pytest.skip(f"py-spy may not attach here (ptrace): {sampler.errors}")
    assert sampler.counts["other"] > 50  # ~250 samples a second of a busy Python frame
