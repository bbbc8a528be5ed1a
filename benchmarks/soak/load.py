"""The soak's traffic and what the client saw: open-loop Poisson arrivals of interactive streams,
interactive completions and asynchronous batch submissions, periodic batch bursts into the
bounded queue, then the drain; errors by kind (429 expected), enqueue latency and TTFT."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.soak.options import SoakOptions

EXPECTED_PREFIX = "HTTP 429"  # the only error a healthy plane may answer with (queue full)


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
