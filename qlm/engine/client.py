"""The EngineClient protocol: how an agent drives one engine, whatever it is.

Three implementations share it (DESIGN.md, spine 3): `vllm` (a real vLLM server process),
`emulated` (the engine model on the wall clock) and `simulated` (the engine model on a virtual
clock). Calls never block: `submit`, `abort`, `swap_out`, `swap_in` and `load_model` take effect
in the engine's own time, and what happened comes back as events from `poll()`. Live
implementations do their I/O in background tasks and keep `observe()` current.

The observation and event types are in engine_types.py (no asyncio); this module adds the
protocol and EventBuffer / EventWaiter, with which a live engine's agent sleeps until events
arrive, and `LiveEngine`, the lifecycle every live engine shares (start, close, `async with`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import math
from collections.abc import Sequence
from typing import Protocol, Self, runtime_checkable

from qlm.engine.engine_types import EngineEvent, EngineObservation, TokenChunk
from qlm.types import Request

TIMER_SLACK_S = 1e-3  # EventBuffer.wait: a deadline this close counts as reached


class EventBuffer:
    """Where a live engine's background tasks leave events for the agent. `wait` lets the
    agent sleep until there is something to handle instead of polling on a timer, so a
    token reaches the client one hop after the engine made it. Event-loop thread only.

    Token chunks may wait to be written together (`wait(..., tokens_after_s=...)`): while
    only TokenChunks are pending, the agent is woken once the oldest of them is that old,
    so a request's tokens leave in one queue write per interval instead of one per engine
    step (each write is a Redis round trip, a poke, a read and an SSE event on the API).
    Every other event (a first token, a finish, an abort, a load) wakes the agent at once
    and takes the pending chunks with it: TTFT and end-to-end latency are not delayed."""

    def __init__(self) -> None:
        self._events: list[EngineEvent] = []
        self._ready = asyncio.Event()  # anything pending
        self._urgent = asyncio.Event()  # something other than a token chunk pending
        self._chunks_since_s: float | None = None  # when the oldest pending chunk came (loop time)

    def __len__(self) -> int:
        return len(self._events)

    def append(self, event: EngineEvent) -> None:
        self._events.append(event)
        if not isinstance(event, TokenChunk):
            self._urgent.set()
        elif self._chunks_since_s is None:
            self._chunks_since_s = _loop_time_s()
        self._ready.set()

    def drain(self) -> list[EngineEvent]:
        events, self._events = self._events, []
        self._ready.clear()
        self._urgent.clear()
        self._chunks_since_s = None
        return events

    async def wait(self, timeout_s: float, tokens_after_s: float = 0.0) -> bool:
        """True once events are due: any event but a token chunk, or token chunks the
        oldest of which came `tokens_after_s` ago; False after `timeout_s` with nothing
        pending (chunks still held back at the timeout count as due)."""
        loop = asyncio.get_running_loop()
        end_s = loop.time() + timeout_s
        while True:
            # Within TIMER_SLACK_S counts as reached: uvloop's timers run on whole
            # milliseconds and may fire that much early; waiting again would spin.
            now_s = loop.time() + TIMER_SLACK_S
            if not self._events:
                signal, until_s = self._ready, end_s
            elif self._urgent.is_set() or self._chunks_since_s is None:
                return True
            else:
                due_s = self._chunks_since_s + tokens_after_s
                if due_s <= now_s or end_s <= now_s:
                    return True
                signal, until_s = self._urgent, min(due_s, end_s)
            if until_s <= now_s:
                return bool(self._events)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(until_s - now_s + TIMER_SLACK_S):
                    await signal.wait()


def _loop_time_s() -> float:
    """The running event loop's clock (the one its timers run on); -inf outside a loop (an
    engine driven by hand, as tests do: its chunks are due at once)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return -math.inf


@runtime_checkable
class EventWaiter(Protocol):
    """A live engine the agent can sleep on instead of polling (see EventBuffer)."""

    async def wait_events(self, timeout_s: float, tokens_after_s: float = 0.0) -> bool:
        """EventBuffer.wait: True once events are due, False after `timeout_s`."""
        ...


@runtime_checkable
class StandbyFetcher(Protocol):
    """An engine that fills its standby tier in the background (the simulated engine)."""

    def fetch_standby(self, model: str, replacing: str | None = None) -> None: ...


@runtime_checkable
class EngineClient(Protocol):
    """One engine instance as an agent sees it. All calls return at once."""

    @property
    def instance_id(self) -> str: ...

    def observe(self) -> EngineObservation:
        """The engine's current state."""
        ...

    def submit(self, request: Request) -> None:
        """Admit a request; the engine schedules it (continuous batching)."""
        ...

    def abort(self, request_ids: Sequence[str]) -> None:
        """Drop requests; each produces an Aborted event and frees its KV."""
        ...

    def swap_out(self, request_ids: Sequence[str]) -> None:
        """Move requests' KV to CPU memory; they pause. EngineError if unsupported."""
        ...

    def swap_in(self, request_ids: Sequence[str]) -> None:
        """Bring swapped requests back; they resume where they stopped."""
        ...

    def load_model(self, model: str) -> None:
        """Switch to another model. Every admitted request is aborted first (Aborted events);
        the engine is LOADING until a ModelLoaded event."""
        ...

    def poll(self) -> list[EngineEvent]:
        """Events since the last poll, in the order they happened."""
        ...


class LiveEngine(abc.ABC):
    """The lifecycle of an engine on the wall clock (emulated, native, vLLM): `start` brings
    it up, `close` stops its background work and releases what it holds (idempotent), and
    `async with engine:` does both. The simulated engine has none: the simulator owns its
    clock and nothing runs in the background."""

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
