"""The streaming HTTP client of VllmEngine: one aiohttp task per admitted request.

Question answered: how does a request admitted to the vLLM server become events? Each request
is a task that POSTs the body of protocol.py (completions or chat) and turns the SSE chunks into
FirstToken, TokenChunk and RequestFinished events; an error, a broken stream or vLLM's own
abort ends it with Aborted. Aborting cancels the task, which closes the HTTP stream; vLLM aborts
a request whose client disconnects. Every request ends with exactly one RequestFinished or
Aborted. Event-loop thread only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import aiohttp

from qlm.clock import Clock
from qlm.engine.client import EventBuffer
from qlm.engine.engine_types import Aborted, EngineRequest, FirstToken, RequestFinished, TokenChunk
from qlm.engine.vllm.protocol import SseLines, StreamDelta, parse_sse_line
from qlm.output_extras import merge_extras
from qlm.types import Request


@dataclass(slots=True)
class Flight:
    """A request admitted to the server and not yet ended."""

    request: Request
    prompt_tokens: int
    output_tokens: int = 0
    first_token_at_s: float | None = None
    finish_reason: str = "length"
    text: list[str] = field(default_factory=list)
    extras: dict[str, Any] | None = None  # merged tool calls and log probabilities
    task: asyncio.Task[None] | None = None


class RequestStreams:
    """The requests in flight on one engine, each streamed by its own task. `http` is the
    engine's session (set while the engine is started)."""

    def __init__(self, events: EventBuffer, clock: Clock) -> None:
        self.http: aiohttp.ClientSession | None = None
        self._events = events
        self._clock = clock
        self._flights: dict[str, Flight] = {}

    def __len__(self) -> int:
        return len(self._flights)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._flights

    def requests(self) -> tuple[EngineRequest, ...]:
        """The requests in flight as the agent sees them (admitted, started, tokens so far)."""
        return tuple(
            EngineRequest(
                request_id=rid,
                slo_class=f.request.slo_class,
                prompt_tokens=f.prompt_tokens,
                max_output_tokens=f.request.max_output_tokens,
                output_tokens=f.output_tokens,
                started=f.first_token_at_s is not None,
            )
            for rid, f in self._flights.items()
        )

    def tasks(self) -> list[asyncio.Task[None]]:
        return [f.task for f in self._flights.values() if f.task is not None]

    def start(self, request: Request, url: str, body: dict[str, Any]) -> None:
        """Admit a request: a task streams `body` from `url`."""
        flight = Flight(request, prompt_tokens=request.prompt_tokens)
        self._flights[request.id] = flight
        flight.task = asyncio.get_running_loop().create_task(
            self._stream(flight, url, body), name=f"vllm-{request.id}"
        )

    def abort(self, request_ids: Sequence[str], reason: str) -> None:
        """End requests at once (Aborted); unknown ids are ignored."""
        for rid in request_ids:
            flight = self._flights.get(rid)
            if flight is not None:
                self._drop(flight, reason)

    def abort_all(self, reason: str) -> None:
        for flight in list(self._flights.values()):
            self._drop(flight, reason)

    async def _stream(self, flight: Flight, url: str, body: dict[str, Any]) -> None:
        assert self.http is not None
        rid = flight.request.id
        try:
            async with self.http.post(url, json=body) as response:
                if response.status != HTTPStatus.OK:
                    detail = (await response.read()).decode(errors="replace")[:300]
                    self._end(flight, f"vllm http {response.status}: {detail}")
                    return
                lines = SseLines()
                async for data in response.content.iter_any():
                    for line in lines.feed(data):
                        delta = parse_sse_line(line)
                        if delta is not None:
                            self._on_delta(flight, delta)
        except Exception as exc:  # any failure of one stream ends that request only
            self._end(flight, f"stream broken: {exc!r}")
            return
        if flight.finish_reason == "abort":
            self._end(flight, "aborted by vLLM")
        elif self._flights.get(rid) is flight:
            now = self._clock.now_s()
            first = now if flight.first_token_at_s is None else flight.first_token_at_s
            text = "".join(flight.text)
            del self._flights[rid]
            self._events.append(
                RequestFinished(
                    rid,
                    now,
                    first,
                    flight.output_tokens,
                    flight.finish_reason,
                    text,
                    prompt_tokens=flight.prompt_tokens,
                    extras=flight.extras,
                )
            )

    def _on_delta(self, flight: Flight, delta: StreamDelta) -> None:
        rid = flight.request.id
        if self._flights.get(rid) is not flight:
            return
        if delta.error is not None:
            self._end(flight, f"vllm error: {delta.error}")
            return
        if delta.prompt_tokens is not None:
            flight.prompt_tokens = delta.prompt_tokens
        if delta.finish_reason is not None:
            flight.finish_reason = delta.finish_reason
        if delta.completion_tokens is not None:
            new = delta.completion_tokens - flight.output_tokens
        else:  # no usage statistics: one token per chunk with text
            new = 1 if delta.text else 0
        if new <= 0 and not delta.text and not delta.extras:
            return
        now = self._clock.now_s()
        if flight.first_token_at_s is None:
            flight.first_token_at_s = now
            self._events.append(FirstToken(rid, now))
        flight.output_tokens += max(new, 0)
        flight.text.append(delta.text)
        flight.extras = merge_extras(flight.extras, delta.extras)
        self._events.append(TokenChunk(rid, now, delta.text, max(new, 0), delta.extras))

    def _end(self, flight: Flight, reason: str) -> None:
        """End a request with Aborted (once; later calls for it do nothing)."""
        rid = flight.request.id
        if self._flights.get(rid) is flight:
            del self._flights[rid]
            self._events.append(Aborted(rid, self._clock.now_s(), reason))

    def _drop(self, flight: Flight, reason: str) -> None:
        """End a request from outside its task: close its stream, then Aborted."""
        if flight.task is not None and flight.task is not asyncio.current_task():
            flight.task.cancel()
        self._end(flight, reason)
