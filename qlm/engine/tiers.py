"""The standby tier of one instance: which models sleep there, ready to wake fast.

Question answered: when an instance changes models, is the new one woken (its weights in host
memory: vLLM sleep mode level 1, or a co-resident standby server) or loaded cold from disk, and
what happens to the one it leaves? `StandbyTier` keeps up to `capacity` sleeping models, most
recently served first: the model an instance leaves goes to sleep, and when the tier is full
the one served least recently goes cold. A profile's `wake_s` prices a wake, its `load_s` a
cold load (`Profile.load_time_s`).
"""

from __future__ import annotations

from collections.abc import Iterable


class StandbyTier:
    def __init__(self, capacity: int, sleeping: Iterable[str] = ()) -> None:
        if capacity < 0:
            raise ValueError("standby capacity must be >= 0")
        self.capacity = capacity
        self._sleeping: list[str] = list(dict.fromkeys(sleeping))[:capacity]

    @property
    def models(self) -> tuple[str, ...]:
        """The sleeping models, most recently served first."""
        return tuple(self._sleeping)

    def sleep(self, model: str) -> None:
        """`model` leaves the GPU: it sleeps here (the least recently served goes cold when
        the tier is full; with no capacity it goes cold itself)."""
        if model in self._sleeping:
            self._sleeping.remove(model)
        self._sleeping.insert(0, model)
        del self._sleeping[self.capacity :]

    def wake(self, model: str) -> bool:
        """`model` is to serve: whether it was sleeping here (it leaves the tier)."""
        if model in self._sleeping:
            self._sleeping.remove(model)
            return True
        return False
