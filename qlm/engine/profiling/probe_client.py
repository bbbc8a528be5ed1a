"""The profiler's HTTP client: raw streamed completions and patient /metrics scrapes (httpx).

Question answered: how does the live profiler (vllm_profiler.py) talk to a vLLM server? It
streams /v1/completions bodies it built itself (token-id prompts, exact lengths) and watches
only the token counts and the client's own time to first token; it reads /metrics with
retries, because on a busy host the server may not even accept a connection for seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from qlm.clock import Clock
from qlm.engine.vllm.protocol import SseLines, parse_sse_line

SCRAPE_TIMEOUT_S = 30.0
SCRAPE_ATTEMPTS = 3

Progress = Callable[[str], None]


class ProfilingError(RuntimeError):
    """The engine could not be profiled as planned (the message says why)."""


@dataclass
class ProbeStream:
    """One streamed completion as the client sees it."""

    started_s: float
    first_token_s: float | None = None
    tokens: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    error: str | None = None
    task: asyncio.Task[None] | None = None


class ProbeClient:
    """Requests to the server at `base_url`, on the profiler's httpx client."""

    def __init__(
        self, http: httpx.AsyncClient, base_url: str, clock: Clock, progress: Progress
    ) -> None:
        self.base_url = base_url
        self._http = http
        self._clock = clock
        self._progress = progress

    def start(self, body: Mapping[str, Any]) -> ProbeStream:
        """Send a streamed completion; its task reads the stream to the end."""
        stream = ProbeStream(started_s=self._clock.monotonic_s())
        stream.task = asyncio.get_running_loop().create_task(self._read(stream, body))
        return stream

    async def finish(self, streams: list[ProbeStream]) -> None:
        """Wait for the streams to end; ProfilingError for the first that failed."""
        await asyncio.gather(*(s.done.wait() for s in streams))
        for s in streams:
            if s.error is not None:
                raise ProfilingError(s.error)

    @staticmethod
    async def cancel(streams: list[ProbeStream]) -> None:
        tasks = [s.task for s in streams if s.task is not None and not s.task.done()]
        for task in tasks:
            task.cancel()  # closing the stream makes vLLM abort the request
        await asyncio.gather(*tasks, return_exceptions=True)

    async def version(self) -> str:
        """The server's vLLM version ("unknown" when it does not say)."""
        try:
            response = await self._http.get(f"{self.base_url}/version")
            return str(response.json()["version"])
        except (httpx.HTTPError, ValueError, KeyError):
            return "unknown"

    async def metrics_text(self) -> str:
        """/metrics, patiently: on a busy host the server may not even accept a connection
        for seconds."""
        for attempt in range(1, SCRAPE_ATTEMPTS + 1):
            try:
                response = await self._http.get(
                    f"{self.base_url}/metrics", timeout=SCRAPE_TIMEOUT_S
                )
                response.raise_for_status()
                return response.text
            except httpx.TransportError as exc:
                if attempt == SCRAPE_ATTEMPTS:
                    raise ProfilingError(f"/metrics unreachable: {exc!r}") from None
                self._progress(f"/metrics: {exc!r}; again")
        raise AssertionError("unreachable")

    async def _read(self, stream: ProbeStream, body: Mapping[str, Any]) -> None:
        url = f"{self.base_url}/v1/completions"
        try:
            async with self._http.stream("POST", url, json=body) as response:
                if response.status_code != httpx.codes.OK:
                    detail = (await response.aread()).decode(errors="replace")[:300]
                    stream.error = f"vllm http {response.status_code}: {detail}"
                    return
                lines = SseLines()
                async for data in response.aiter_bytes():
                    for line in lines.feed(data):
                        self._on_line(stream, line)
        except httpx.HTTPError as exc:
            stream.error = f"stream broken: {exc!r}"
        finally:
            stream.done.set()

    def _on_line(self, stream: ProbeStream, line: str) -> None:
        delta = parse_sse_line(line)
        if delta is None:
            return
        if delta.error is not None:
            stream.error = delta.error
        elif delta.completion_tokens is not None and delta.completion_tokens > stream.tokens:
            if stream.first_token_s is None:
                stream.first_token_s = self._clock.monotonic_s()
            stream.tokens = delta.completion_tokens
