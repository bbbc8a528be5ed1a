"""The event core: one ordering key, one heap, a virtual clock that only the core advances, and
a seeded random stream per stochastic component.

Events are ordered by `event_key(time_s, priority, sequence)` and by nothing else: earlier time
first; at the same instant, the lower `Priority` first; then the order they were scheduled in
(the sequence number), so ties never depend on hashing or on the payload.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Callable
from enum import IntEnum

import numpy as np

from qlm.clock import VirtualClock


class Priority(IntEnum):
    """Order of events that fall on the same instant (lower runs first)."""

    ENGINE = 0  # engine progress: completions free capacity before anything decides
    ARRIVAL = 1  # new requests join the queue
    TIMER = 2  # policy timers: ticks, plans becoming ready
    SAMPLE = 3  # measurements see the state after everything else at that instant


EventKey = tuple[float, int, int]
Handler = Callable[[], None]


def event_key(time_s: float, priority: Priority, sequence: int) -> EventKey:
    """The one ordering key of the simulator: (time, priority, sequence)."""
    return (time_s, int(priority), sequence)


class EventLoop:
    """A heap of scheduled handlers on a virtual clock.

    `run` pops events in key order, moves the clock to each event's time and calls its handler;
    handlers schedule further events. Nothing else advances the clock.
    """

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock if clock is not None else VirtualClock()
        self._heap: list[tuple[float, int, int, Handler]] = []
        self._sequence = 0
        self._cancelled: set[int] = set()
        self._stopping = False
        self.processed = 0

    def now_s(self) -> float:
        return self.clock.now_s()

    def schedule(self, at_s: float, priority: Priority, handler: Handler) -> EventKey:
        """Run `handler` at virtual time `at_s` (never earlier than now)."""
        now_s = self.clock.now_s()
        if not at_s >= now_s:  # also rejects NaN
            raise ValueError(f"cannot schedule an event in the past: {at_s} < {now_s}")
        key = event_key(at_s, priority, self._sequence)
        self._sequence += 1
        heapq.heappush(self._heap, (*key, handler))
        return key

    def cancel(self, key: EventKey) -> None:
        """Forget a pending event; it is skipped when its time comes. (Cancelling an event
        that already ran is a caller error and has no effect on later events.)"""
        self._cancelled.add(key[2])

    def next_at_s(self) -> float | None:
        """Time of the next live event, or None when nothing is scheduled."""
        self._drop_cancelled_head()
        return self._heap[0][0] if self._heap else None

    def stop(self) -> None:
        """Make `run` return after the event being processed."""
        self._stopping = True

    def run(self, until_s: float = math.inf) -> int:
        """Process events in key order until none is left, the next one lies after `until_s`,
        or a handler calls `stop()`. Returns the events processed."""
        heap, cancelled, clock = self._heap, self._cancelled, self.clock
        self._stopping = False
        done = 0
        while heap and not self._stopping:
            at_s, _, sequence, handler = heap[0]
            if at_s > until_s:
                break
            heapq.heappop(heap)
            if sequence in cancelled:
                cancelled.discard(sequence)
                continue
            clock.advance_to(at_s)
            handler()
            done += 1
        self.processed += done
        return done

    def _drop_cancelled_head(self) -> None:
        while self._heap and self._heap[0][2] in self._cancelled:
            self._cancelled.discard(heapq.heappop(self._heap)[2])


class RandomStreams:
    """One independent, seeded numpy Generator per named component.

    A component's stream depends only on the seed and its name (never on the order components
    ask for streams), so adding a component does not shift the numbers another one draws.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._streams: dict[str, np.random.Generator] = {}

    def generator(self, component: str) -> np.random.Generator:
        stream = self._streams.get(component)
        if stream is None:
            stream = np.random.Generator(np.random.PCG64(self._sequence(component)))
            self._streams[component] = stream
        return stream

    def seed_for(self, component: str) -> int:
        """An integer seed for a component that takes one (e.g. a simulated engine)."""
        return int(self._sequence(component).generate_state(1, np.uint64)[0])

    def _sequence(self, component: str) -> np.random.SeedSequence:
        return np.random.SeedSequence(self.seed, spawn_key=(_stable_id(component),))


def _stable_id(name: str) -> int:
    """A process-independent integer for a name (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")
