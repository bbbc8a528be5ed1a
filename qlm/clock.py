"""Injected time. Nothing in the core reads time or sleeps except through a Clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of time: wall time for live runs, virtual time for the simulator."""

    def now_s(self) -> float:
        """Seconds since the epoch (wall) or since the start of a simulation (virtual)."""
        ...

    def monotonic_s(self) -> float:
        """A clock for measuring durations; never goes backwards."""
        ...


class WallClock:
    """Real time."""

    def now_s(self) -> float:
        return time.time()

    def monotonic_s(self) -> float:
        return time.perf_counter()


class VirtualClock:
    """Time that moves only when told to; used by the simulator and by tests."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        return self._now_s

    def monotonic_s(self) -> float:
        return self._now_s

    def advance_to(self, at_s: float) -> None:
        if at_s < self._now_s:
            raise ValueError(f"virtual time cannot go back: {at_s} < {self._now_s}")
        self._now_s = at_s

    def advance_by(self, delta_s: float) -> None:
        self.advance_to(self._now_s + delta_s)
