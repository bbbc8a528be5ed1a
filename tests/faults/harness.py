"""The pieces of a fault test: a throwaway redis-server that can be killed and restarted on its
own data, `qlm api|controller|agent` as separate OS processes on one fleet file, and HTTP
clients (httpx for the asynchronous API, the official openai client for streams).

The fleet is small and fast: emulated engines that generate exactly `max_tokens` placeholder
tokens (" tok" each) at 20 ms per token, leases of 2 s renewed every 2/3 s, a control loop that
ticks every 0.1 s and a leader lease of 1 s, so a fault is noticed and repaired within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import psutil
import yaml

from qlm.queue.records import InstanceStatus, RequestRecord
from qlm.queue.redis import RedisQueue, RedisQueueConfig
from qlm.queue.redis.connect import store_client
from tests.faults.report import FaultReport
from tests.redis_server import RedisServer, RedisServerError, free_port, redis_server_binary

ROOT = Path(__file__).resolve().parents[2]
QLM_MAIN = "import sys; from qlm.cli import main; sys.exit(main())"
KEY_PREFIX = "faults:"
MODEL = "m-a"
TOKEN = " tok"  # the emulated engine's text per token
LEASE_S = 2.0
START_TIMEOUT_S = 90.0  # a cold Python start of qlm on a busy 2-core machine

PROFILE: dict[str, Any] = {
    "model": MODEL,
    "gpu_type": "A100",
    "weight_bytes": 14 << 30,
    "kv_bytes_per_token": 128 * 1024,
    "decode_table": {"batch_sizes": [1, 8], "step_s": [0.02, 0.02]},
    "prefill_tokens_per_s": 100_000,
    "output_tokens_mean": 100,
    "output_tokens_std": 10,
    "load_s": 0.5,
    "max_batch_size": 8,
}


def fleet_config(redis_url: str, *, count: int = 2, **sections: Any) -> dict[str, Any]:
    """The fault tests' fleet file as a dict; `sections` replace top-level sections."""
    config: dict[str, Any] = {
        "qlm": {
            "slo_classes": [
                {"name": "interactive", "ttft_s": 5.0, "lateness_weight": 100, "priority": 2},
                {"name": "batch-2", "ttft_s": 600.0, "lateness_weight": 1, "priority": 0},
            ],
            "default_slo_class": "interactive",
            "planner": {"policy": "edf"},
            "control": {"tick_s": 0.1},
        },
        "queue": {"url": redis_url, "key_prefix": KEY_PREFIX},
        "api": {"host": "127.0.0.1", "port": 0, "completion_timeout_s": 120},
        "controller": {"leader_lease_s": 1.0, "instance_timeout_s": 1.5},
        "agent": {"poll_s": 0.01, "lease_s": LEASE_S, "status_every_s": 0.25},
        "engine": {"kind": "emulated", "speedup": 1.0, "output_length": "cap"},
        "metrics": {"host": "127.0.0.1", "port": 0},  # several processes share a host
        "models": [{"name": MODEL, "max_context_tokens": 4096}],
        "fleet": {
            "packaged_profiles": False,
            "profiles": [PROFILE],
            "instances": [{"id": "i", "gpu_type": "A100", "model": MODEL, "count": count}],
        },
    }
    return config | sections


# ---------------------------------------------------------------------------- redis-server


class FaultRedis(RedisServer):
    """A RedisServer that can be killed with SIGKILL and started again on the same port and
    data directory (so an AOF written before the kill is replayed)."""

    def __init__(self, *, appendfsync: str | None = None) -> None:
        super().__init__(appendonly=appendfsync is not None)
        self.appendfsync = appendfsync

    def _arguments(self) -> list[str]:
        args = super()._arguments()
        if self.appendfsync is not None:
            args += ["--appendfsync", self.appendfsync]
        return args

    @property
    def pid(self) -> int:
        assert self._process is not None, "redis-server is not running"
        return self._process.pid

    def kill9(self) -> None:
        assert self._process is not None, "redis-server is not running"
        self._process.kill()
        self._process.wait()
        self._process = None

    def restart(self) -> None:
        """Start again on the same port and directory (after kill9)."""
        binary = redis_server_binary()
        assert binary is not None
        assert self.dir is not None
        self._process = subprocess.Popen(
            [binary, *self._arguments()],
            cwd=self.dir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not self._wait_ready():
            raise RedisServerError(f"redis-server did not restart on port {self.port}")


# ---------------------------------------------------------------------------- qlm processes


@dataclass
class QlmProcess:
    """One `qlm` process this test started."""

    role: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    port: int | None = None
    instances: tuple[str, ...] = ()
    started_at_s: float = field(default_factory=time.time)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        assert self.port is not None, f"{self.role} serves no HTTP"
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def descendants(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return list(psutil.Process(self.pid).children(recursive=True))
        return []

    def kill9(self) -> None:
        """SIGKILL, as the kernel's OOM killer or a node failure would end it."""
        self.popen.kill()
        self.popen.wait()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGINT (qlm shuts down cleanly on it), SIGKILL after grace_s; then whatever it
        started that outlived it, by process and process group."""
        children = self.descendants()
        if self.alive:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill9()
        kill_tree(children)

    def log_tail(self, num_lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
            return "\n".join(lines[-num_lines:])
        return ""


def kill_tree(processes: Sequence[psutil.Process]) -> None:
    """SIGKILL each process and its process group (a vLLM server leads its own session)."""
    for proc in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            proc.kill()


class FaultPlane:
    """`qlm` processes on one fleet file and one Redis, plus a RedisQueue client to inspect
    the queue's state. Use as a context manager: every process is stopped on exit."""

    def __init__(self, config: dict[str, Any], work_dir: Path) -> None:
        self.config = config
        self.work_dir = work_dir
        self.config_path = work_dir / "fleet.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.redis_url = str(config["queue"]["url"])
        self.processes: list[QlmProcess] = []
        self.queue = RedisQueue.from_url(self.redis_url, key_prefix=KEY_PREFIX)
        # The queue's own retry settings (and Sentinel's primary, for a redis+sentinel://
        # URL): the test's reads ride out a Redis restart or failover too.
        self.raw = store_client(RedisQueueConfig(url=self.redis_url))

    def __enter__(self) -> FaultPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.processes:
            proc.stop(grace_s=5.0)
        if exc[0] is not None:
            self.print_logs()

    async def aclose(self) -> None:
        await self.queue.close()
        await self.raw.aclose()

    def print_logs(self) -> None:
        for proc in self.processes:
            print(f"--- {proc.role} (pid {proc.pid}) log tail ---\n{proc.log_tail()}")

    def _start(
        self, role: str, args: Sequence[str], *, port: int | None, instances: Sequence[str] = ()
    ) -> QlmProcess:
        argv = [sys.executable, "-c", QLM_MAIN, *args, "--config", str(self.config_path)]
        argv += ["--log-level", os.environ.get("QLM_TEST_LOG_LEVEL", "WARNING")]  # to debug
        if port is not None:
            argv += ["--port", str(port)]
        log_path = self.work_dir / f"{role}-{len(self.processes)}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        with log_path.open("wb") as log:
            popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        proc = QlmProcess(role, popen, log_path, port, tuple(instances))
        self.processes.append(proc)
        return proc

    def api(self) -> QlmProcess:
        return self._start("api", ["api"], port=free_port())

    def controller(self) -> QlmProcess:
        return self._start("controller", ["controller"], port=None)

    def agent(self, *instances: str) -> QlmProcess:
        args = ["agent"]
        for instance in instances:
            args += ["--instance", instance]
        return self._start(f"agent-{'+'.join(instances)}", args, port=None, instances=instances)

    async def ready(self, *procs: QlmProcess, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until each process is up: an API answers /readyz, an agent has reported its
        instances since it started, a controller leads (the leader key is set)."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            for proc in procs:
                while not await self._is_ready(proc, http):
                    if not proc.alive:
                        raise RuntimeError(f"{proc.role} exited:\n{proc.log_tail()}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{proc.role} not ready:\n{proc.log_tail()}")
                    await asyncio.sleep(0.1)

    async def _is_ready(self, proc: QlmProcess, http: httpx.AsyncClient) -> bool:
        if proc.port is not None:
            with contextlib.suppress(httpx.HTTPError):
                return (await http.get(f"{proc.url}/readyz")).status_code == 200
            return False
        if proc.instances:
            fresh = {
                s.instance_id for s in await self.queue.instances() if s.at_s >= proc.started_at_s
            }
            return set(proc.instances) <= fresh
        return await self.leader() is not None

    async def leader(self) -> str | None:
        return cast(str | None, await self.raw.get(f"{KEY_PREFIX}leader"))

    async def plan_epoch(self) -> int:
        plan = await self.queue.current_plan()
        return -1 if plan is None else plan.epoch

    async def records(self, ids: Sequence[str]) -> list[RequestRecord | None]:
        return list(await asyncio.gather(*(self.queue.get(rid) for rid in ids)))

    async def statuses(self) -> dict[str, InstanceStatus]:
        return {s.instance_id: s for s in await self.queue.instances()}

    async def done_events(self, request_id: str) -> int:
        """DONE events in the request's output stream: a result delivered twice shows as 2."""
        entries = cast(
            list[tuple[str, dict[str, str]]], await self.raw.xrange(f"{KEY_PREFIX}s:{request_id}")
        )
        return sum(fields.get("k") == "done" for _, fields in entries)


# ---------------------------------------------------------------------------- clients


def completion_body(index: int, max_tokens: int, slo_class: str = "batch-2") -> dict[str, Any]:
    return {
        "kind": "completion",
        "model": MODEL,
        "prompt": f"fault test document {index}",
        "max_tokens": max_tokens,
        "slo_class": slo_class,
    }


async def submit_async(
    http: httpx.AsyncClient, count: int, *, max_tokens: int, first_index: int = 0
) -> list[str]:
    """Submit through POST /v1/qlm/requests; every answer must be 202 with an id."""
    ids = []
    for i in range(first_index, first_index + count):
        response = await http.post("/v1/qlm/requests", json=completion_body(i, max_tokens))
        assert response.status_code == 202, response.text
        ids.append(str(response.json()["id"]))
    return ids


@dataclass(frozen=True, slots=True)
class Load:
    """An open-loop load: `rate_per_s` asynchronous requests a second for `duration_s`,
    `tokens` each."""

    rate_per_s: float
    duration_s: float
    tokens: int


async def offer_load(
    api_url: str,
    accepted: list[str],
    refused: Counter[str],
    load: Load,
    accepted_at_s: list[float] | None = None,
) -> None:
    """Submit `load` open loop (a request does not wait for the one before, so many are in
    flight during a fault), noting 202 ids (and, given `accepted_at_s`, the monotonic time of
    each 202) and every other answer."""

    async def one(http: httpx.AsyncClient, index: int, at_s: float) -> None:
        await asyncio.sleep(max(0.0, at_s - time.monotonic()))
        try:
            response = await http.post("/v1/qlm/requests", json=completion_body(index, load.tokens))
        except httpx.HTTPError as exc:
            refused[type(exc).__name__] += 1
            return
        if response.status_code == 202:
            accepted.append(str(response.json()["id"]))
            if accepted_at_s is not None:
                accepted_at_s.append(time.monotonic())
        else:
            refused[f"HTTP {response.status_code}"] += 1

    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(base_url=api_url, timeout=20.0, limits=limits) as http:
        start = time.monotonic()
        count = int(load.rate_per_s * load.duration_s)
        await asyncio.gather(*(one(http, i, start + i / load.rate_per_s) for i in range(count)))


@dataclass
class StreamResult:
    """What one streaming client saw."""

    request_id: str | None = None
    text: str = ""
    finish_reason: str | None = None
    usage_tokens: int | None = None
    error: str | None = None
    error_after_s: float | None = None  # from the last chunk to the error

    @property
    def tokens(self) -> int:
        return self.text.count(TOKEN)


async def stream_completion(
    base_url: str,
    max_tokens: int,
    result: StreamResult,
    *,
    timeout_s: float = 90.0,
    model: str = MODEL,
) -> StreamResult:
    """One streamed completion through the official openai client (no retries), filling
    `result` as chunks arrive so the test can watch progress. A connection error or an error
    event ends it with `error` set; a hang past timeout_s also does (as an error named so)."""
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    last_chunk_s = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            stream = await client.completions.create(
                model=model,
                prompt="a streamed question",
                max_tokens=max_tokens,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers={"x-qlm-slo-class": "interactive"},
            )
            result.request_id = stream.response.headers.get("x-qlm-request-id")
            async for chunk in stream:
                last_chunk_s = time.monotonic()
                if chunk.usage is not None:
                    result.usage_tokens = chunk.usage.completion_tokens
                for choice in chunk.choices:
                    result.text += choice.text or ""
                    result.finish_reason = choice.finish_reason or result.finish_reason
                # Chunks already buffered are read without suspending: let a watcher (a test
                # waiting to act mid-generation) run between them.
                await asyncio.sleep(0)
    except TimeoutError:
        result.error = f"hang: no end within {timeout_s} s"
    except Exception as exc:  # what the client sees is the point of the test
        result.error = f"{type(exc).__name__}: {exc}"
        result.error_after_s = time.monotonic() - last_chunk_s
    finally:
        await client.close()
    return result


async def wait_terminal(
    plane: FaultPlane, ids: Sequence[str], timeout_s: float
) -> dict[str, RequestRecord | None]:
    """Poll the queue until every id is terminal (or timeout_s passes); the last records."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = dict(zip(ids, await plane.records(ids), strict=True))
        pending = [rid for rid, r in records.items() if r is None or not r.state.is_terminal]
        if not pending or time.monotonic() > deadline:
            return records
        await asyncio.sleep(0.2)


async def views_via(base_url: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """GET /v1/qlm/requests/{id} for each id through one API replica (the client's view)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=10.0, trust_env=False) as http:
        responses = await asyncio.gather(*(http.get(f"/v1/qlm/requests/{rid}") for rid in ids))
    views = {}
    for rid, response in zip(ids, responses, strict=True):
        assert response.status_code == 200, f"{rid}: {response.status_code} {response.text}"
        views[rid] = response.json()
    return views


def judge_async(report: FaultReport, views: dict[str, dict[str, Any]], max_tokens: int) -> None:
    """An asynchronous request completed when GET shows it completed with all its tokens;
    failed when GET shows a terminal error; otherwise it is lost (left unreported)."""
    for rid, view in views.items():
        result = view.get("result")
        if view["state"] == "completed" and result is not None:
            if result["usage"]["completion_tokens"] != max_tokens:
                report.duplicate(rid, f"{result['usage']['completion_tokens']} tokens")
            report.complete(rid)
        elif view["state"] in ("failed", "cancelled"):
            report.fail(rid, str(result))


def judge_stream(report: FaultReport, stream: StreamResult, max_tokens: int) -> None:
    """A stream completed when it ended with a finish_reason and exactly max_tokens tokens;
    more tokens than generated are a duplicate delivery."""
    assert stream.request_id is not None, f"the stream never started: {stream.error}"
    if stream.tokens > max_tokens or (stream.usage_tokens or 0) > max_tokens:
        report.duplicate(stream.request_id, f"{stream.tokens} tokens streamed, {max_tokens} made")
    if stream.error is None and stream.finish_reason and stream.tokens == max_tokens:
        report.complete(stream.request_id)
    elif stream.error is not None:
        report.fail(stream.request_id, stream.error)


async def judge_outcomes(
    report: FaultReport,
    plane: FaultPlane,
    accepted: Sequence[str],
    streams: Sequence[StreamResult],
    tokens: int,
    stream_tokens: int,
) -> None:
    """What the clients finally saw, through the API: every accepted asynchronous request
    (`tokens` each) and every stream (`stream_tokens`; one cut by the fault is judged by its
    record, where its result waits), and any result delivered twice (DONE events)."""
    api_url = next(p.url for p in plane.processes if p.role == "api")
    stream_ids = [s.request_id for s in streams if s.request_id is not None]
    views = await views_via(api_url, [*accepted, *stream_ids])
    judge_async(report, {rid: views[rid] for rid in accepted}, tokens)
    for stream in streams:
        if stream.error is None:
            judge_stream(report, stream, stream_tokens)
        else:
            assert stream.request_id is not None
            report.note(f"stream {stream.request_id} cut: {stream.error[:80]!r}")
            judge_async(report, {stream.request_id: views[stream.request_id]}, stream_tokens)
    for rid in [*accepted, *stream_ids]:
        if (done := await plane.done_events(rid)) != 1:
            report.duplicate(rid, f"{done} DONE events")


@contextlib.contextmanager
def redis_for_faults(appendfsync: str | None = None) -> Iterator[FaultRedis]:
    server = FaultRedis(appendfsync=appendfsync)
    server.start()
    try:
        yield server
    finally:
        server.stop()
