"""The embedded queue's output streams (`MemoryStreams`): each request's events (token chunks,
requeues, its end) in order, for the API replica that keeps the client's connection; and the
broadcast wake-up (`Signal`) readers of streams, plans and changes wait on.

A stream is opened when its request is enqueued and dropped with its finished record
(qlm/queue/memory.py). A reader gets every event from the start, in batches of what was
appended since its last read, then waits for the next one; it ends after the `DONE` event.
Like the rest of the embedded queue it relies on asyncio's one thread: an append and the
wake-up it fires run to the end before any reader resumes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from qlm.queue.queue_protocol import UnknownRequestError, through_done
from qlm.queue.records import StreamEvent


class Signal:
    """A broadcast wake-up: `fire` wakes every current waiter; later waiters wait anew."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float | None) -> bool:
        event = self._event
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class MemoryStreams:
    """Every open request's events, and a wake-up per stream someone waits on."""

    def __init__(self) -> None:
        self._events: dict[str, list[StreamEvent]] = {}
        self._signals: dict[str, Signal] = {}

    def open(self, request_id: str) -> None:
        self._events[request_id] = []

    def append(self, event: StreamEvent) -> None:
        self._events.setdefault(event.request_id, []).append(event)
        signal = self._signals.pop(event.request_id, None)
        if signal is not None:
            signal.fire()

    def drop(self, request_id: str) -> None:
        self._events.pop(request_id, None)
        self._signals.pop(request_id, None)

    async def read(
        self, request_id: str, timeout_s: float | None = None
    ) -> AsyncGenerator[Sequence[StreamEvent], None]:
        """The request's events from the first, in batches: all that were appended since the
        last batch was read, each batch read without waiting; between batches, waits for
        the next event at most `timeout_s` (TimeoutError). UnknownRequestError for a request
        with no stream."""
        events = self._events.get(request_id)
        if events is None:
            raise UnknownRequestError(request_id)
        index = 0
        while True:
            if index < len(events):
                batch, done = through_done(events[index:])
                index += len(batch)
                yield batch
                if done:
                    return
                continue
            signal = self._signals.get(request_id)
            if signal is None:
                signal = self._signals[request_id] = Signal()
            if not await signal.wait(timeout_s):
                raise TimeoutError(f"no stream event for {request_id!r} within {timeout_s} s")
