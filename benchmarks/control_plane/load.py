"""The admission load generator: how a fixed request is offered to the API at a Poisson rate
(open loop) or back to back (closed loop) from worker processes, and what each request's
scheduled send, actual send and answer were."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection


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
