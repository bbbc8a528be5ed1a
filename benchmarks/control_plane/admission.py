"""Admission: how many requests per second the HTTP API admits into the Redis queue, and with what
enqueue latency, per setup (`api x1`, `api x2`, `serve`, `split`) and offered rate."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common.plane import (
    Proc,
    example_fleet,
    instance_ids,
    redis_pid,
    start_qlm,
    stop,
    wait_http,
)
from benchmarks.common.stats import percentile_or_nan
from benchmarks.control_plane.cpu import CpuMeter
from benchmarks.control_plane.load import LoadSpec, Samples, collect_load, http_request, start_load
from benchmarks.control_plane.targets import KNEE_SHARE
from tests.redis_server import RedisServer, free_port

SATURATED = 0.8  # below this x offered, higher rates of the setup are skipped
SETUPS = ("api x1", "api x2", "serve", "split")

ADMISSION_BODY = {
    "kind": "completion",
    "model": "mistral-7b",
    "prompt": "Summarise the queue report for the batch window of the night shift, please.",
    "max_tokens": 64,
    "slo_class": "batch-2",
}


@dataclass(frozen=True)
class AdmissionStep:
    setup: str
    rate_per_s: float | None  # None: closed loop
    connections: int


@dataclass(frozen=True)
class AdmissionOptions:
    duration_s: float
    warmup_s: float
    clients: int
    connections: int  # open loop, over all clients
    closed_connections: int  # closed loop, over all clients
    work_dir: Path


def fleet_config(redis_url: str, path: Path) -> Path:
    """examples/fleet.yaml (emulated mixed fleet, 4 instances) on the given Redis."""
    data = example_fleet()
    data["queue"] = {"url": redis_url, "key_prefix": "bench:"}
    data["api"] = {"host": "127.0.0.1", "port": 0}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start_setup(setup: str, config: Path, log_dir: Path) -> list[Proc]:
    """The processes of one setup; API processes first (they carry ports)."""
    if setup == "serve":
        procs = [start_qlm(["serve"], config, log_dir, free_port())]
    else:
        replicas = 1 if setup == "api x1" else 2
        procs = [start_qlm(["api"], config, log_dir, free_port()) for _ in range(replicas)]
    if setup == "split":
        procs.append(start_qlm(["controller"], config, log_dir))
        agent = ["agent", *(a for i in instance_ids(config) for a in ("--instance", i))]
        procs.append(start_qlm(agent, config, log_dir))
    try:
        for proc in procs:
            if proc.port is not None:
                wait_http(proc, "/readyz", 120.0)
    except Exception:
        for proc in procs:
            stop(proc)
        raise
    return procs


def flush_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushall()
    finally:
        client.close()


def run_step(step: AdmissionStep, opts: AdmissionOptions, redis_url: str) -> dict[str, Any]:
    flush_redis(redis_url)
    config = fleet_config(redis_url, opts.work_dir / "fleet.yaml")
    procs = start_setup(step.setup, config, opts.work_dir)
    try:
        time.sleep(0.5)  # let the parts settle (first plan, agents' first rounds)
        return _measure_step(step, opts, procs, redis_pid(redis_url))
    finally:
        for proc in procs:
            stop(proc)


def _measure_step(
    step: AdmissionStep, opts: AdmissionOptions, procs: Sequence[Proc], redis: int
) -> dict[str, Any]:
    ports = tuple(p.port for p in procs if p.port is not None)
    body = http_request(ports[0], "/v1/qlm/requests", json.dumps(ADMISSION_BODY).encode())
    duration_s = opts.duration_s + opts.warmup_s
    start_at = time.monotonic() + 1.0
    specs = [
        LoadSpec(
            targets=ports[k % len(ports) :] + ports[: k % len(ports)],
            connections=max(1, step.connections // opts.clients),
            duration_s=duration_s,
            start_at=start_at,
            rate_per_s=None if step.rate_per_s is None else step.rate_per_s / opts.clients,
            seed=1000 * k + int(step.rate_per_s or 0),
            body=body,
        )
        for k in range(opts.clients)
    ]
    workers = start_load(specs)
    time.sleep(max(0.0, start_at - time.monotonic()))
    cpu = CpuMeter({**{f"{p.name}:{p.pid}": p.pid for p in procs}, "redis": redis})
    samples = collect_load(workers)
    cpu_used = cpu.stop(samples.cpu_s, sum(samples.ok))
    row = summarise_admission(samples, start_at + opts.warmup_s, start_at + duration_s)
    return {
        "setup": step.setup,
        "mode": "open" if step.rate_per_s is not None else "closed",
        "offered_per_s": step.rate_per_s,
        "connections": step.connections,
        **row,
        **cpu_used,
        "late_start_ms": 1e3 * samples.late_start_s,
    }


def summarise_admission(samples: Samples, window_start: float, window_end: float) -> dict[str, Any]:
    """Requests scheduled inside [window_start, window_end): throughput and enqueue latency."""
    rows = [
        (s, sent, d, ok)
        for s, sent, d, ok in zip(
            samples.scheduled, samples.sent, samples.done, samples.ok, strict=True
        )
        if window_start <= s < window_end
    ]
    good = [(s, sent, d) for s, sent, d, ok in rows if ok]
    latency_ms = [1e3 * (d - s) for s, _, d in good]
    service_ms = [1e3 * (d - sent) for _, sent, d in good]
    span_s = max([window_end - window_start] + [d - window_start for _, _, d in good])
    return {
        "requests": len(rows),
        "accepted": len(good),
        "errors": len(rows) - len(good),
        "statuses": {str(k): v for k, v in sorted(samples.statuses.items())},
        "achieved_per_s": len(good) / span_s,
        "p50_ms": percentile_or_nan(latency_ms, 0.50),
        "p90_ms": percentile_or_nan(latency_ms, 0.90),
        "p99_ms": percentile_or_nan(latency_ms, 0.99),
        "max_ms": max(latency_ms, default=float("nan")),
        "service_p99_ms": percentile_or_nan(service_ms, 0.99),
    }


def admission_steps(
    setups: Sequence[str], rates: Sequence[float], opts: AdmissionOptions
) -> list[AdmissionStep]:
    steps = []
    for setup in setups:
        steps += [AdmissionStep(setup, rate, opts.connections) for rate in rates]
        steps.append(AdmissionStep(setup, None, opts.closed_connections))
    return steps


def run_admission(
    setups: Sequence[str], rates: Sequence[float], opts: AdmissionOptions
) -> list[dict[str, Any]]:
    """Each setup's open-loop rates in increasing order (the rest skipped once two rates in a
    row fall far behind: SATURATED), then its closed-loop step (the saturation rate), then an
    open-loop step at KNEE_SHARE of that rate (mode `knee`)."""
    rows: list[dict[str, Any]] = []
    behind: dict[str, int] = {}  # setup -> consecutive steps far behind their rate
    with RedisServer() as server:
        for step in admission_steps(setups, rates, opts):
            if step.rate_per_s is not None and behind.get(step.setup, 0) >= 2:
                continue
            row = _run_reported(step, opts, server.url)
            rows.append(row)
            if step.rate_per_s is not None:
                far = "error" in row or row["achieved_per_s"] < SATURATED * step.rate_per_s
                behind[step.setup] = behind.get(step.setup, 0) + 1 if far else 0
            elif "error" not in row:
                knee = AdmissionStep(
                    step.setup, KNEE_SHARE * row["achieved_per_s"], opts.connections
                )
                rows.append(_run_reported(knee, opts, server.url) | {"mode": "knee"})
    return rows


def _run_reported(step: AdmissionStep, opts: AdmissionOptions, redis_url: str) -> dict[str, Any]:
    try:
        row = run_step(step, opts, redis_url)
    except Exception as exc:  # a failed setup is reported, the others still run
        row = {"setup": step.setup, "offered_per_s": step.rate_per_s, "error": repr(exc)}
    _progress(row)
    return row


def _progress(row: Mapping[str, Any]) -> None:
    if "error" in row:
        print(f"  {row['setup']}: {row['error']}", file=sys.stderr)
        return
    offered = "closed" if row["offered_per_s"] is None else f"{row['offered_per_s']:.0f}/s"
    print(
        f"  {row['setup']:<7} {offered:>8}: {row['achieved_per_s']:7.0f}/s "
        f"p50 {row['p50_ms']:7.2f} ms p99 {row['p99_ms']:8.2f} ms errors {row['errors']} "
        f"cpu api {row['cpu_api_cores']:.2f} redis {row['cpu_redis_cores']:.2f} "
        f"clients {row['cpu_clients_cores']:.2f} others {row['cpu_others_cores']:.2f}",
        file=sys.stderr,
    )
