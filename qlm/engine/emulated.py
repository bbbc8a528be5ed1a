"""EmulatedEngine: the engine model behind the EngineClient protocol, on the wall clock.

For running the live control plane without GPUs. The engine model runs in engine time, which
starts at 0 and passes `speedup` times faster than the clock (1.0: real time; tests use 10-100).
A background asyncio task sleeps until the model's next state change, the next streaming tick or
the next operation, then advances the model and turns its events into client events, with
placeholder text: every generated token is `token_text`, streamed in TokenChunks every
`stream_interval_s` of engine time (and at each request's end). Event times are on the clock
(`clock.now_s()` at start plus engine time / speedup).

Output lengths come from an OutputLengthPolicy: "profile" (default) draws each request's length
from the loaded profile's output distribution, seeded per request, capped by
max_output_tokens; "cap" generates exactly max_output_tokens.

Calls are synchronous and must come from the event loop's thread; poll() and observe() bring the
model up to the current time themselves, so events are never late by more than a poll.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import replace

from qlm.clock import Clock
from qlm.config.engine_config import EngineConfig
from qlm.engine.client import EventBuffer, LiveEngine
from qlm.engine.engine_types import (
    EngineEvent,
    EngineObservation,
    FirstToken,
    RequestFinished,
    TokenChunk,
)
from qlm.engine.model.core import EngineModel
from qlm.engine.model.output_length import OUTPUT_LENGTHS, OutputLengthPolicy
from qlm.engine.model.stats import EngineStats
from qlm.perf.profile import Profile
from qlm.types import Fleet, Instance, Request

MIN_WAKE_S = 0.002  # shortest wall-clock sleep of the background task


class EmulatedEngine(LiveEngine):
    """One engine instance emulated in (scaled) real time (EngineClient)."""

    def __init__(
        self,
        instance: Instance,
        profiles: Fleet | Iterable[Profile],
        clock: Clock,
        *,
        speedup: float = 1.0,
        config: EngineConfig | None = None,
        output_length: str | OutputLengthPolicy = "profile",
        seed: int = 0,
        stream_interval_s: float = 0.05,
        token_text: str = " tok",
    ) -> None:
        if not speedup > 0:
            raise ValueError("speedup must be > 0")
        if not stream_interval_s > 0:
            raise ValueError("stream_interval_s must be > 0")
        self.clock = clock
        self.speedup = speedup
        self.stream_interval_s = stream_interval_s
        self.token_text = token_text
        self.model = EngineModel(instance, profiles, config, start_s=0.0)
        self._lengths = (
            OUTPUT_LENGTHS.create(output_length, seed=seed)
            if isinstance(output_length, str)
            else output_length
        )
        self._origin_now_s = clock.now_s()
        self._origin_mono_s = clock.monotonic_s()
        self._events = EventBuffer()
        self._streamed: dict[str, int] = {}  # tokens sent in chunks, per started request
        self._last_stream_s = 0.0  # engine time of the last streaming tick
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the background task (idempotent)."""
        if self._task is None:
            self._closing = False
            self._task = asyncio.create_task(self._run(), name=f"emulated-{self.instance_id}")

    async def close(self) -> None:
        """Stop the background task (idempotent). The flag, not only the cancellation, ends
        it: a cancellation that races with a wake-up can be lost inside asyncio."""
        task, self._task = self._task, None
        if task is not None:
            self._closing = True
            self._wake.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------------ EngineClient

    @property
    def instance_id(self) -> str:
        return self.model.instance.id

    @property
    def stats(self) -> EngineStats:
        return self.model.stats

    def observe(self) -> EngineObservation:
        self._pump()
        t = self._engine_now_s()
        return replace(self.model.observe(t), at_s=self._clock_s(t))

    def submit(self, request: Request) -> None:
        profile = self.model.profile
        length = None if profile is None else self._lengths.output_tokens(request, profile)
        self.model.add(request, self._engine_now_s(), output_tokens=length)
        self._wake.set()

    def abort(self, request_ids: Sequence[str]) -> None:
        self.model.abort(request_ids, self._engine_now_s())
        self._wake.set()

    def swap_out(self, request_ids: Sequence[str]) -> None:
        self.model.swap_out(request_ids, self._engine_now_s())
        self._wake.set()

    def swap_in(self, request_ids: Sequence[str]) -> None:
        self.model.swap_in(request_ids, self._engine_now_s())
        self._wake.set()

    def load_model(self, model: str) -> None:
        self.model.load(model, self._engine_now_s())
        self._wake.set()

    def fetch_standby(self, model: str, replacing: str | None = None) -> None:
        """Read `model` into the standby tier while serving (StandbyFetcher)."""
        self.model.fetch_standby(model, self._engine_now_s(), replacing)
        self._wake.set()

    def poll(self) -> list[EngineEvent]:
        self._pump()
        return self._events.drain()

    async def wait_events(self, timeout_s: float, tokens_after_s: float = 0.0) -> bool:
        """Sleep until events are due (True) or `timeout_s` passed (False): EventBuffer.wait."""
        return await self._events.wait(timeout_s, tokens_after_s)

    # ------------------------------------------------------------------ time

    def _engine_now_s(self) -> float:
        elapsed = self.clock.monotonic_s() - self._origin_mono_s
        return max(self.model.now_s, elapsed * self.speedup)

    def _clock_s(self, engine_s: float) -> float:
        return self._origin_now_s + engine_s / self.speedup

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        while not self._closing:
            self._wake.clear()
            self._pump()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._sleep_s()):
                    await self._wake.wait()

    def _sleep_s(self) -> float | None:
        """Wall seconds until the next model change or streaming tick (None: until woken)."""
        now = self._engine_now_s()
        due = [t for t in (self.model.next_event_at_s(), self._next_stream_s()) if t is not None]
        if not due:
            return None
        return max(MIN_WAKE_S, (min(due) - now) / self.speedup)

    def _next_stream_s(self) -> float | None:
        if not self._streamed:
            return None
        return self._last_stream_s + self.stream_interval_s

    def _pump(self) -> None:
        """Advance the model to now; translate its events; stream the tokens made since."""
        now = self._engine_now_s()
        for event in self.model.advance_to(now):
            self._translate(event)
        if self._streamed and now >= self._last_stream_s + self.stream_interval_s:
            self._stream(now)

    def _translate(self, event: EngineEvent) -> None:
        if isinstance(event, FirstToken):
            at = self._clock_s(event.at_s)
            self._events.append(FirstToken(event.request_id, at))
            self._events.append(TokenChunk(event.request_id, at, self.token_text, 1))
            self._streamed[event.request_id] = 1
        elif isinstance(event, RequestFinished):
            at = self._clock_s(event.at_s)
            rest = event.output_tokens - self._streamed.pop(event.request_id, 0)
            if rest > 0:
                self._events.append(TokenChunk(event.request_id, at, self.token_text * rest, rest))
            text = self.token_text * event.output_tokens
            self._events.append(
                replace(
                    event,
                    at_s=at,
                    first_token_at_s=self._clock_s(event.first_token_at_s),
                    text=text,
                )
            )
        else:
            self._streamed.pop(getattr(event, "request_id", ""), None)
            self._events.append(replace(event, at_s=self._clock_s(event.at_s)))

    def _stream(self, now: float) -> None:
        self._last_stream_s = now
        at = self._clock_s(now)
        for request in self.model.observe(now).requests:
            sent = self._streamed.get(request.request_id)
            if sent is None or request.output_tokens <= sent:
                continue
            new = request.output_tokens - sent
            self._streamed[request.request_id] = request.output_tokens
            self._events.append(TokenChunk(request.request_id, at, self.token_text * new, new))
