"""The EngineClient protocol: how an agent drives one engine, whatever it is.

Three implementations share it (DESIGN.md, spine 3): `vllm` (a real vLLM server process),
`emulated` (the engine model on the wall clock) and `simulated` (the engine model on a virtual
clock). Calls never block: `submit`, `abort`, `swap_out`, `swap_in` and `load_model` take effect
in the engine's own time, and what happened comes back as events from `poll()`. Live
implementations do their I/O in background tasks and keep `observe()` current.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from qlm.types import Request


class EngineState(StrEnum):
    EMPTY = "empty"  # no model loaded
    LOADING = "loading"  # loading or swapping a model; serves nothing
    READY = "ready"  # a model is loaded and requests run
    FAILED = "failed"  # the engine died; the agent restarts it or gives up


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """A request the engine holds, as the agent's reconcile step needs to see it."""

    request_id: str
    slo_class: str
    prompt_tokens: int
    max_output_tokens: int
    output_tokens: int  # generated so far
    started: bool  # produced its first token
    kv_on_cpu: bool = False  # swapped out; neither running nor holding GPU KV

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class EngineObservation:
    """What the engine looks like now. `requests` holds every request the engine has admitted
    and not finished: running, waiting inside the engine, or swapped to CPU."""

    instance_id: str
    state: EngineState
    model: str | None
    requests: tuple[EngineRequest, ...]
    kv_used_tokens: int
    kv_capacity_tokens: int
    max_num_seqs: int
    supports_kv_swap: bool = False
    at_s: float = 0.0

    @property
    def active(self) -> tuple[EngineRequest, ...]:
        """Requests on the GPU (running or waiting in the engine), not swapped out."""
        return tuple(r for r in self.requests if not r.kv_on_cpu)

    @property
    def swapped(self) -> tuple[EngineRequest, ...]:
        return tuple(r for r in self.requests if r.kv_on_cpu)

    @property
    def free_slots(self) -> int:
        return max(0, self.max_num_seqs - len(self.active))

    @property
    def free_kv_tokens(self) -> int:
        return max(0, self.kv_capacity_tokens - self.kv_used_tokens)


@dataclass(frozen=True, slots=True)
class FirstToken:
    request_id: str
    at_s: float


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """Streamed output (live engines only; the simulator does not emit text)."""

    request_id: str
    at_s: float
    text: str
    num_tokens: int


@dataclass(frozen=True, slots=True)
class Finished:
    request_id: str
    at_s: float
    first_token_at_s: float
    output_tokens: int
    finish_reason: str = "length"  # "length" | "stop"
    text: str = ""  # full output where the engine produces text
    prompt_tokens: int | None = None  # the engine's own count, where it reports one


@dataclass(frozen=True, slots=True)
class Aborted:
    """The engine dropped the request (after abort(), or on its own with a reason)."""

    request_id: str
    at_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class ModelLoaded:
    model: str
    at_s: float
    load_s: float


@dataclass(frozen=True, slots=True)
class EngineFailed:
    at_s: float
    reason: str


EngineEvent = FirstToken | TokenChunk | Finished | Aborted | ModelLoaded | EngineFailed


class EventBuffer:
    """Where a live engine's background tasks leave events for the agent. `wait` lets the
    agent sleep until there is something to handle instead of polling on a timer, so a
    token reaches the client one hop after the engine made it. Event-loop thread only."""

    def __init__(self) -> None:
        self._events: list[EngineEvent] = []
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._events)

    def append(self, event: EngineEvent) -> None:
        self._events.append(event)
        self._ready.set()

    def drain(self) -> list[EngineEvent]:
        events, self._events = self._events, []
        self._ready.clear()
        return events

    async def wait(self, timeout_s: float) -> bool:
        """True once events are pending; False after `timeout_s` without any."""
        if self._events:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._ready.wait()
        return bool(self._events)


@runtime_checkable
class EventWaiter(Protocol):
    """A live engine the agent can sleep on instead of polling (see EventBuffer)."""

    async def wait_events(self, timeout_s: float) -> bool: ...


class EngineError(RuntimeError):
    """An engine refused an operation (unknown model, no KV swap support, not ready)."""


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
