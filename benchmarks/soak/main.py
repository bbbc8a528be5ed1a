"""One soak run: start the plane on a throwaway Redis, drive the load while sampling memory, drain,
stop, and write the results, the verdict and (full runs) the docs block."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common.plane import redis_pid, stop_all, wait_http
from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    run_header,
    write_docs_block,
    write_results,
)
from benchmarks.soak.load import LoadStats, drain, drive
from benchmarks.soak.memory import memory_summary, sample_memory
from benchmarks.soak.options import SoakOptions, parse_args
from benchmarks.soak.plane import fleet_file, start_plane
from benchmarks.soak.summary import latency_summary, render, verdict
from tests.redis_server import RedisServer

RESULTS_PATH = RESULTS_DIR / "soak.json"
QUICK_RESULTS_PATH = RESULTS_DIR / "soak_quick.json"
DOCS_BLOCK = "soak"


async def soak(opts: SoakOptions, work_dir: Path) -> dict[str, Any]:
    duration_s = opts.minutes * 60.0
    with RedisServer() as redis_server:
        config = fleet_file(redis_server.url, opts, work_dir / "fleet.yaml")
        procs = start_plane(opts.setup, config, work_dir)
        try:
            wait_http(procs[0], "/readyz", 180.0)
            await asyncio.sleep(2.0)  # controller and agents report, plans flow
            base_url = f"http://127.0.0.1:{procs[0].port}"
            pids = {p.name: p.pid for p in procs}
            pids["redis-server"] = redis_pid(redis_server.url)
            samples: list[dict[str, Any]] = []
            stats = LoadStats()
            done = asyncio.Event()
            t0 = time.monotonic()
            sampler = asyncio.create_task(
                sample_memory(pids, opts.sample_s, t0, samples, done, stats)
            )
            await drive(base_url, opts, duration_s, stats)
            load_s = time.monotonic() - t0
            counts = await drain(base_url, opts.drain_timeout_s)
            done.set()
            await sampler
            for proc in procs:
                if proc.popen.poll() is not None:
                    stats.error("exited", proc.name)
        finally:
            stop_all(procs)
    return {
        "duration_s": round(load_s, 1),
        "offered": dict(stats.offered),
        "offered_per_s": sum(stats.offered.values()) / max(load_s, 1e-9),
        "accepted": dict(stats.ok),
        "accepted_total": sum(stats.ok.values()),
        "errors": dict(stats.errors),
        "transport_errors": stats.transport_errors,
        "error_details": stats.error_details,
        "log_tails": {p.name: p.log_tail(20, "\n") for p in procs} if stats.error_details else {},
        "final_counts": counts,
        "enqueue_latency": latency_summary(stats.enqueue_ms["steady"]),
        "enqueue_latency_burst": latency_summary(stats.enqueue_ms["burst"]),
        "interactive_ttft": latency_summary(stats.ttft_ms),
        "memory_samples": samples,
        "memory": memory_summary(samples, load_s),
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts, quick, out = parse_args(argv)
    header = run_header(
        "soak.py", argv, "2 cores shared with other jobs; load and plane share them"
    )
    with tempfile.TemporaryDirectory(prefix="qlm-soak-") as tmp:
        report = asyncio.run(soak(opts, Path(tmp)))
    finish_header(header)
    report = {"header": header, "options": vars(opts), **report}
    report["verdict"] = verdict(report)
    text = render(report)
    print(text)
    write_results(out or (QUICK_RESULTS_PATH if quick else RESULTS_PATH), report)
    if not quick and out is None:
        write_docs_block(DOCS_BLOCK, text)
    ok = report["verdict"]
    return (
        0
        if ok["memory_flat"] and not ok["unexpected_errors"] and ok["all_accepted_completed"]
        else 1
    )
