"""Streamed completions as a client sees them: distinct prompts, a workload sent all at once or
at Poisson arrivals, each stream's send, first text and end, and, for requests served through
QLM, where their time to first token went (from QLM's own records)."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from benchmarks.common.stats import percentile_or_nan
from qlm.engine.vllm.protocol import SseLines

_WORDS = (
    "the queue model plans request group engine token batch slot deadline serve load swap "
    "prefill decode cache memory latency throughput instance fleet class interactive schedule"
)
PROMPT_WORDS = tuple(_WORDS.split(" "))


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
            async for line in _sse_lines(response):
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


async def _sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The stream's lines split at LF only (`aiter_lines` also splits at U+2028 and U+0085,
    which a random model's tokens hold and JSON leaves unescaped)."""
    lines = SseLines()
    async for data in response.aiter_bytes():
        for line in lines.feed(data):
            yield line


async def run_workload(
    base_url: str, workload: Workload, seed: int, in_flight: int | None = None
) -> list[StreamSample]:
    """The workload's streams; with `in_flight`, at most that many open at once (each waits
    for a place before its send)."""
    url = f"{base_url}/v1/completions"
    places = asyncio.Semaphore(in_flight or workload.num_requests)

    async def one(body: dict[str, Any], at: float) -> StreamSample:
        async with places:
            return await stream_one(client, url, body, at)

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
            await asyncio.gather(*(one(b, start + o) for b, o in zip(bodies, offsets, strict=True)))
        )


PHASES = ("admit_ms", "dispatch_ms", "engine_ttft_ms", "delivery_ms")


async def qlm_phases(base_url: str, samples: Sequence[StreamSample]) -> dict[str, Any]:
    """For requests served through QLM, their TTFT in four phases, from QLM's own records
    (wall clock; the client's times are converted to it): admit (client send to admission),
    dispatch (admission to the agent's submit into the engine), engine TTFT (submit to the
    first token as the agent sees it), delivery (that token to the client). Also the run's
    `qlm_first_submit_ms`: its first send to the first submit into the engine (the engine
    idles until then; vLLM driven directly starts on its first arrival)."""
    phases: dict[str, Any] = {name: [] for name in PHASES}
    mine = [s for s in samples if s.request_id and s.first is not None]
    if not mine:
        return phases
    submits: list[float] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0, trust_env=False) as client:
        for sample in mine:
            response = await client.get(f"/v1/qlm/requests/{sample.request_id}")
            times = response.json().get("times", {})
            marks = [times.get(k) for k in ("arrival_at_s", "dispatched_at_s", "first_token_at_s")]
            if None in marks or sample.first is None:
                continue
            sent, first = sample.sent + sample.wall_offset_s, sample.first + sample.wall_offset_s
            points = [sent, *marks, first]
            submits.append(points[2])
            for name, a, b in zip(PHASES, points, points[1:], strict=False):
                phases[name].append(1e3 * (b - a))
    if submits:
        start = min(s.sent + s.wall_offset_s for s in samples)
        phases["qlm_first_submit_ms"] = 1e3 * (min(submits) - start)
    return phases


def _completion_body(index: int, workload: Workload) -> dict[str, Any]:
    return {
        "model": "tiny-a",
        "prompt": prompt_text(index, workload.prompt_words),
        "max_tokens": workload.output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,  # vLLM: exact lengths (QLM passes it on to its engine)
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
        "first_token_ms": 1e3 * (min(s.first for s in good if s.first is not None) - start),
        "requests_per_s": len(good) / makespan_s,
        "ttft_ms": ttft_ms,
        "ttft_p50_ms": percentile_or_nan(ttft_ms, 0.5),
        "ttft_p90_ms": percentile_or_nan(ttft_ms, 0.9),
        "e2e_p50_ms": percentile_or_nan([1e3 * (s.done - s.sent) for s in good], 0.5),
    }
