"""Soak: hold a mixed interactive + batch load against the live control plane for minutes and
check that it stays healthy: resident memory flat, no errors but the expected 429s, and the
enqueue latency of the asynchronous API.

    .venv/bin/python benchmarks/soak.py               # 10 minutes; results + docs block
    .venv/bin/python benchmarks/soak.py --minutes 30
    .venv/bin/python benchmarks/soak.py --quick       # 10 s smoke; soak_quick.json, no docs

The plane runs as separate processes (`qlm api`, `qlm controller`, `qlm agent` for every
instance; `--setup serve` runs `qlm serve` instead) on examples/fleet.yaml's emulated mixed
fleet, sped up (`engine.speedup`), on a throwaway redis-server. The queue is bounded
(`queue.max_queued`, part of it reserved for interactive requests), and batch bursts overrun
it on purpose: those 429s are the expected errors; anything else counts as an error.

Load (open loop, Poisson arrivals, seeded): interactive streaming chat completions and
non-streaming completions, steady asynchronous batch-1/batch-2 submissions, and a burst of
batch-2 submissions every `--burst-every-s`. After the load, the plane drains and every
request it accepted must have completed (queue counts).

Memory: the resident set size of each qlm process (and redis-server) every `--sample-s`,
with psutil; the report gives it over time and a least-squares slope over the run after a
warm-up (the first 20 % of it): what a leak would show. Results: benchmarks/results/soak.json
and the soak block of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks.*, tests.*

from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from tests.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
FLEET_PATH = ROOT / "examples" / "fleet.yaml"
RESULTS_PATH = RESULTS_DIR / "soak.json"
QUICK_RESULTS_PATH = RESULTS_DIR / "soak_quick.json"
DOCS_BLOCK = "soak"
QLM_MAIN = "import sys; from qlm.cli import main; sys.exit(main())"
EXPECTED_PREFIX = "HTTP 429"  # the only error a healthy plane may answer with (queue full)
MIB = 1024 * 1024
WARMUP_SHARE = 0.2  # the slope leaves out the first 20 % of the run (imports, caches, pools)
FLAT_MIB = 10.0  # growth after warm-up a healthy process may show over the run (allocator noise)
# Redis keeps every finished request's record and stream for finished_ttl_s (24 h by default),
# so its memory grows with the requests served, by design: reported, not judged.
NOT_JUDGED = frozenset({"redis-server"})
IN_FLIGHT = "in_flight_peak"  # key of the client's concurrency in the memory samples


@dataclass(frozen=True)
class SoakOptions:
    minutes: float
    setup: str
    speedup: float
    interactive_rps: float
    chat_share: float  # of interactive arrivals: streaming chat; the rest non-streaming
    batch_rps: float
    burst_every_s: float
    burst_size: int
    max_queued: int
    reserved_queued: int
    sample_s: float
    seed: int
    drain_timeout_s: float


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    role: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    port: int | None = None

    def log_tail(self, num_lines: int = 10) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])
        return ""


def fleet_file(redis_url: str, opts: SoakOptions, path: Path) -> Path:
    """examples/fleet.yaml on the throwaway Redis, bounded, with sped-up emulated engines."""
    data = yaml.safe_load(FLEET_PATH.read_text())
    data["queue"] = {
        "url": redis_url,
        "key_prefix": "soak:",
        "max_queued": opts.max_queued,
        "reserved_queued": opts.reserved_queued,
    }
    data["api"] = {"host": "127.0.0.1", "port": 0, "completion_timeout_s": 120}
    data["engine"] = {**data.get("engine", {}), "speedup": opts.speedup}
    data["metrics"] = {"host": "127.0.0.1", "port": 0}  # several processes on one host
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def instance_ids(config: Path) -> list[str]:
    from qlm.serve.config import ServeConfig

    data = yaml.safe_load(config.read_text())
    return [i.id for i in ServeConfig.model_validate(data).instance_list()]


def start(role: str, args: Sequence[str], config: Path, log_dir: Path, port: int | None) -> Proc:
    argv = [sys.executable, "-c", QLM_MAIN, *args, "--config", str(config)]
    if port is not None:
        argv += ["--port", str(port)]
    log_path = log_dir / f"{role}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    return Proc(role, popen, log_path, port)


def start_plane(setup: str, config: Path, log_dir: Path) -> list[Proc]:
    """The processes of a setup, the one serving HTTP first."""
    if setup == "serve":
        return [start("serve", ["serve"], config, log_dir, free_port())]
    agent_args = ["agent"]
    for instance in instance_ids(config):
        agent_args += ["--instance", instance]
    return [
        start("api", ["api"], config, log_dir, free_port()),
        start("controller", ["controller"], config, log_dir, None),
        start("agent", agent_args, config, log_dir, None),
    ]


async def wait_ready(proc: Proc, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.role} exited:\n{proc.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"http://127.0.0.1:{proc.port}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{proc.role} not ready:\n{proc.log_tail()}")


def stop(procs: Sequence[Proc]) -> None:
    for proc in procs:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.popen.wait(20)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait()


# --------------------------------------------------------------------------- memory


def rss_mib(pid: int) -> float | None:
    """Resident set size of a process and its children (a vLLM server would be one)."""
    try:
        proc = psutil.Process(pid)
        total = proc.memory_info().rss
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
    except psutil.Error:
        return None
    return total / MIB


async def sample_memory(
    pids: dict[str, int],
    every_s: float,
    t0: float,
    out: list[dict[str, Any]],
    stop: asyncio.Event,
    stats: LoadStats,
) -> None:
    """RSS of each process every every_s, with the most requests the client had open at
    once since the previous sample (memory high-water marks follow concurrency peaks)."""
    while not stop.is_set():
        row: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 1)}
        for role, pid in pids.items():
            value = rss_mib(pid)
            row[role] = None if value is None else round(value, 2)
        row[IN_FLIGHT] = stats.in_flight_peak
        stats.in_flight_peak = stats.in_flight
        out.append(row)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def slope_mib_per_hour(times_s: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of values over time, per hour."""
    n = len(times_s)
    if n < 2:
        return 0.0
    mean_t, mean_v = sum(times_s) / n, sum(values) / n
    var = sum((t - mean_t) ** 2 for t in times_s)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in zip(times_s, values, strict=True))
    return cov / var * 3600.0


def memory_summary(samples: Sequence[dict[str, Any]], duration_s: float) -> dict[str, Any]:
    """Per process: RSS at start, after warm-up and at the end; the slope after warm-up; and
    whether it stayed flat (the fitted growth over the rest of the run within FLAT_MIB)."""
    roles = [k for k in samples[0] if k not in ("t_s", IN_FLIGHT)] if samples else []
    warm_s = WARMUP_SHARE * duration_s
    summary: dict[str, Any] = {}
    for role in roles:
        points = [(s["t_s"], s[role]) for s in samples if s.get(role) is not None]
        after = [(t, v) for t, v in points if t >= warm_s] or points
        slope = slope_mib_per_hour([t for t, _ in after], [v for _, v in after])
        span_s = after[-1][0] - after[0][0] if after else 0.0
        growth = slope * span_s / 3600.0
        summary[role] = {
            "start_mib": points[0][1] if points else None,
            "after_warmup_mib": after[0][1] if after else None,
            "end_mib": points[-1][1] if points else None,
            "peak_mib": max(v for _, v in points) if points else None,
            "slope_mib_per_hour": round(slope, 2),
            "fitted_growth_mib": round(growth, 2),
            "flat": abs(growth) <= FLAT_MIB,
        }
    return summary


# --------------------------------------------------------------------------- load


@dataclass
class LoadStats:
    offered: Counter[str] = field(default_factory=Counter)
    ok: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # "what [kind]" -> count
    transport_errors: int = 0  # no HTTP answer: the plane may have taken the request or not
    error_details: list[str] = field(default_factory=list)  # the first few, for the report
    enqueue_ms: dict[str, list[float]] = field(  # async POST -> 202: steady, burst
        default_factory=lambda: {"steady": [], "burst": []}
    )
    ttft_ms: list[float] = field(default_factory=list)  # interactive streams
    in_flight: int = 0
    in_flight_peak: int = 0  # since the last memory sample

    def error(self, what: str, kind: str, detail: str = "") -> None:
        self.errors[f"{what} [{kind}]"] += 1
        if not what.startswith(EXPECTED_PREFIX) and len(self.error_details) < 20:
            self.error_details.append(f"{kind}: {what} {detail}"[:300])

    def transport(self, exc: httpx.HTTPError, kind: str) -> None:
        self.transport_errors += 1
        self.error(type(exc).__name__, kind, str(exc))

    @contextlib.contextmanager
    def request(self, kind: str) -> Iterator[None]:
        self.offered[kind] += 1
        self.in_flight += 1
        self.in_flight_peak = max(self.in_flight_peak, self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1


def completion(i: int, slo_class: str, max_tokens: int) -> dict[str, Any]:
    return {
        "kind": "completion",
        "model": "mistral-7b" if i % 3 else "vicuna-13b",
        "prompt": f"soak document {i} " * (4 + i % 24),
        "max_tokens": max_tokens,
        "slo_class": slo_class,
    }


async def submit_async(
    http: httpx.AsyncClient, stats: LoadStats, i: int, slo: str, kind: str = "steady"
) -> None:
    with stats.request(slo):
        sent = time.perf_counter()
        try:
            response = await http.post("/v1/qlm/requests", json=completion(i, slo, 64 + i % 192))
        except httpx.HTTPError as exc:
            stats.transport(exc, slo)
            return
        if response.status_code == 202:
            stats.ok[slo] += 1
            stats.enqueue_ms[kind].append((time.perf_counter() - sent) * 1000.0)
        else:
            stats.error(f"HTTP {response.status_code}", slo, response.text[:200])


async def interactive_stream(http: httpx.AsyncClient, stats: LoadStats, i: int) -> None:
    kind = "interactive-stream"
    body = {
        "model": "mistral-7b",
        "messages": [{"role": "user", "content": f"question {i}"}],
        "max_tokens": 32,
        "stream": True,
    }
    headers = {"x-qlm-slo-class": "interactive"}
    with stats.request(kind):
        sent = time.perf_counter()
        first: float | None = None
        try:
            async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                if r.status_code != 200:
                    stats.error(f"HTTP {r.status_code}", kind, (await r.aread()).decode()[:200])
                    return
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        stats.error(f"stream error {chunk['error'].get('code')}", kind)
                        return
                    content = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
                    if content and first is None:
                        first = time.perf_counter()
        except httpx.HTTPError as exc:
            stats.transport(exc, kind)
            return
        if first is not None:
            stats.ttft_ms.append((first - sent) * 1000.0)
        stats.ok[kind] += 1


async def interactive_plain(http: httpx.AsyncClient, stats: LoadStats, i: int) -> None:
    kind = "interactive"
    body = {"model": "mistral-7b", "prompt": f"quick {i}", "max_tokens": 16}
    with stats.request(kind):
        try:
            response = await http.post(
                "/v1/completions", json=body, headers={"x-qlm-slo-class": "interactive"}
            )
        except httpx.HTTPError as exc:
            stats.transport(exc, kind)
            return
        if response.status_code == 200:
            stats.ok[kind] += 1
        else:
            stats.error(f"HTTP {response.status_code}", kind, response.text[:200])


def arrivals(rate_per_s: float, duration_s: float, rng: random.Random) -> list[float]:
    times, t = [], rng.expovariate(rate_per_s) if rate_per_s > 0 else duration_s
    while t < duration_s:
        times.append(t)
        t += rng.expovariate(rate_per_s)
    return times


async def drive(base_url: str, opts: SoakOptions, duration_s: float, stats: LoadStats) -> None:
    """Schedule every arrival of the run up front (open loop), then wait for all of them."""
    rng = random.Random(opts.seed)
    # Idle connections expire before uvicorn's 5 s keep-alive closes them: a request sent on a
    # connection the server is closing at that moment fails (ReadError) without reaching it.
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200, keepalive_expiry=2.0)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=180.0, limits=limits, trust_env=False
    ) as http:
        jobs: list[tuple[float, str, str]] = []  # (offset, what, slo class)
        for t in arrivals(opts.interactive_rps, duration_s, rng):
            jobs.append((t, "stream" if rng.random() < opts.chat_share else "plain", ""))
        for t in arrivals(opts.batch_rps, duration_s, rng):
            jobs.append((t, "steady", "batch-1" if rng.random() < 0.3 else "batch-2"))
        burst_at = opts.burst_every_s / 2
        while burst_at < duration_s:
            jobs += [(burst_at, "burst", "batch-2")] * opts.burst_size  # all at once
            burst_at += opts.burst_every_s
        start_s = time.monotonic()

        async def one(i: int, offset_s: float, what: str, slo: str) -> None:
            await asyncio.sleep(max(0.0, start_s + offset_s - time.monotonic()))
            if what == "stream":
                await interactive_stream(http, stats, i)
            elif what == "plain":
                await interactive_plain(http, stats, i)
            else:
                await submit_async(http, stats, i, slo, what)

        await asyncio.gather(*(one(i, *job) for i, job in enumerate(sorted(jobs))))


async def queue_counts(base_url: str) -> dict[str, int]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10.0, trust_env=False) as http:
        return dict((await http.get("/v1/qlm/queue")).json()["counts"])


async def drain(base_url: str, timeout_s: float) -> dict[str, int]:
    """Wait until nothing is queued or in flight; the final counts."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts = await queue_counts(base_url)
        live = counts.get("queued", 0) + counts.get("dispatched", 0) + counts.get("running", 0)
        if live == 0 or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(1.0)


# --------------------------------------------------------------------------- report


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))]


def latency_summary(values: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50_ms": _round(percentile(values, 0.5)),
        "p99_ms": _round(percentile(values, 0.99)),
        "max_ms": _round(max(values) if values else None),
    }


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def memory_rows(samples: Sequence[dict[str, Any]], rows: int = 11) -> list[dict[str, Any]]:
    """About `rows` samples spread evenly over the run, first and last included."""
    if len(samples) <= rows:
        return list(samples)
    step = (len(samples) - 1) / (rows - 1)
    return [samples[round(k * step)] for k in range(rows)]


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    """Memory flat (qlm processes); errors other than 429; and every request the plane
    accepted completed: all the client saw accepted, plus at most the requests whose answer
    the client never got (transport errors), none failed, none left in the queue."""
    errors = report["errors"]
    unexpected = {k: v for k, v in errors.items() if not k.startswith(EXPECTED_PREFIX)}
    counts = report["final_counts"]
    unanswered = counts.get("completed", 0) + counts.get("cancelled", 0) - report["accepted_total"]
    live = sum(counts.get(s, 0) for s in ("queued", "dispatched", "running"))
    return {
        "memory_flat": all(m["flat"] for r, m in report["memory"].items() if r not in NOT_JUDGED),
        "unexpected_errors": sum(unexpected.values()),
        "all_accepted_completed": counts.get("failed", 0) == 0
        and live == 0
        and 0 <= unanswered <= report.get("transport_errors", 0),
    }


def render(report: dict[str, Any]) -> str:
    """The docs block (also printed): the header, memory over time, then the checks."""
    minutes = report["duration_s"] / 60.0
    roles = list(report["memory"])
    lines = [
        f"## Soak: mixed interactive + batch load for {minutes:.0f} minutes",
        "",
        *header_lines(report["header"]),
        "",
        f"Setup `{report['options']['setup']}` on a throwaway redis-server; "
        f"examples/fleet.yaml, emulated engines at speedup {report['options']['speedup']:g}; "
        f"offered {report['offered_per_s']:.1f} requests/s "
        f"(interactive {report['options']['interactive_rps']:g}/s, batch "
        f"{report['options']['batch_rps']:g}/s, plus {report['options']['burst_size']} batch-2 "
        f"every {report['options']['burst_every_s']:g} s into a queue bounded at "
        f"{report['options']['max_queued']}).",
        "",
        "Resident memory (MiB) over time:",
        "",
        "| t (s) | " + " | ".join(roles) + " | client requests open (peak) |",
        "|---:|" + "---:|" * (len(roles) + 1),
    ]
    for row in memory_rows(report["memory_samples"]):
        cells = ["-" if row.get(r) is None else f"{row[r]:.1f}" for r in roles]
        cells.append(str(row.get(IN_FLIGHT, "-")))
        lines.append(f"| {row['t_s']:.0f} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| process | start | after warm-up | end | slope after warm-up (MiB/h) | flat |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for role, m in report["memory"].items():
        flat = "not judged" if role in NOT_JUDGED else "yes" if m["flat"] else "NO"
        lines.append(
            f"| {role} | {m['start_mib']:.1f} | {m['after_warmup_mib']:.1f} | {m['end_mib']:.1f} "
            f"| {m['slope_mib_per_hour']:+.1f} | {flat} |"
        )
    lines += [
        "",
        "redis-server keeps each finished request (record and output stream) for "
        "finished_ttl_s (24 h by default): its memory grows with the requests served.",
    ]
    enq, ttft, v = report["enqueue_latency"], report["interactive_ttft"], report["verdict"]
    burst = report["enqueue_latency_burst"]
    errors = ", ".join(f"{k}: {n}" for k, n in sorted(report["errors"].items())) or "none"
    lines += [
        "",
        f"Requests offered {sum(report['offered'].values())}, accepted "
        f"{report['accepted_total']}; final queue counts {report['final_counts']}.  ",
        f"Errors by type: {errors} (expected: 429 only; unexpected: {v['unexpected_errors']}).  ",
        f"Enqueue latency (POST /v1/qlm/requests to 202, client side), steady arrivals: p50 "
        f"{enq['p50_ms']} ms, p99 {enq['p99_ms']} ms, max {enq['max_ms']} ms over {enq['n']} "
        f"requests; during bursts: p50 {burst['p50_ms']} ms, p99 {burst['p99_ms']} ms over "
        f"{burst['n']}.  ",
        f"Interactive streams, time to first token: p50 {ttft['p50_ms']} ms, p99 "
        f"{ttft['p99_ms']} ms.  ",
        f"Verdict: memory flat {v['memory_flat']}, every accepted request completed "
        f"{v['all_accepted_completed']}, unexpected errors {v['unexpected_errors']}.",
    ]
    if report["error_details"]:
        lines += ["", "Unexpected errors (first few):", ""]
        lines += [f"- `{detail}`" for detail in report["error_details"][:5]]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


async def soak(opts: SoakOptions, work_dir: Path) -> dict[str, Any]:
    duration_s = opts.minutes * 60.0
    with RedisServer() as redis_server:
        config = fleet_file(redis_server.url, opts, work_dir / "fleet.yaml")
        procs = start_plane(opts.setup, config, work_dir)
        try:
            await wait_ready(procs[0])
            await asyncio.sleep(2.0)  # controller and agents report, plans flow
            base_url = f"http://127.0.0.1:{procs[0].port}"
            pids = {p.role: p.popen.pid for p in procs}
            pids["redis-server"] = redis_pid(redis_server)
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
                    stats.error("exited", proc.role)
        finally:
            stop(procs)
    return {
        "duration_s": round(load_s, 1),
        "offered": dict(stats.offered),
        "offered_per_s": sum(stats.offered.values()) / max(load_s, 1e-9),
        "accepted": dict(stats.ok),
        "accepted_total": sum(stats.ok.values()),
        "errors": dict(stats.errors),
        "transport_errors": stats.transport_errors,
        "error_details": stats.error_details,
        "log_tails": {p.role: p.log_tail(20) for p in procs} if stats.error_details else {},
        "final_counts": counts,
        "enqueue_latency": latency_summary(stats.enqueue_ms["steady"]),
        "enqueue_latency_burst": latency_summary(stats.enqueue_ms["burst"]),
        "interactive_ttft": latency_summary(stats.ttft_ms),
        "memory_samples": samples,
        "memory": memory_summary(samples, load_s),
    }


def redis_pid(server: RedisServer) -> int:
    import redis

    client = redis.Redis.from_url(server.url)
    try:
        info: dict[str, Any] = client.info("server")
        return int(info["process_id"])
    finally:
        client.close()


def parse_args(argv: Sequence[str]) -> tuple[SoakOptions, bool, Path | None]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="load duration")
    parser.add_argument("--quick", action="store_true", help="10 s smoke, no docs update")
    parser.add_argument("--out", type=Path, help="results file (default: benchmarks/results/)")
    parser.add_argument("--setup", choices=("split", "serve"), default="split")
    parser.add_argument("--speedup", type=float, default=20.0, help="emulated engine speedup")
    parser.add_argument("--interactive-rps", type=float, default=4.0)
    parser.add_argument("--chat-share", type=float, default=0.5)
    parser.add_argument("--batch-rps", type=float, default=12.0)
    parser.add_argument("--burst-every-s", type=float, default=60.0)
    parser.add_argument("--burst-size", type=int, default=200)
    parser.add_argument("--max-queued", type=int, default=40)
    parser.add_argument("--reserved-queued", type=int, default=10)
    parser.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling period")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drain-timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    minutes, burst_every_s, sample_s = args.minutes, args.burst_every_s, args.sample_s
    if args.quick:
        minutes, burst_every_s, sample_s = 10.0 / 60.0, 6.0, 0.5
    opts = SoakOptions(
        minutes=minutes,
        setup=args.setup,
        speedup=args.speedup,
        interactive_rps=args.interactive_rps,
        chat_share=args.chat_share,
        batch_rps=args.batch_rps,
        burst_every_s=burst_every_s,
        burst_size=args.burst_size,
        max_queued=args.max_queued,
        reserved_queued=args.reserved_queued,
        sample_s=sample_s,
        seed=args.seed,
        drain_timeout_s=args.drain_timeout_s,
    )
    return opts, args.quick, args.out


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


if __name__ == "__main__":
    sys.exit(main())
