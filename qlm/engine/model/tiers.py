"""The standby tier of one instance: which models sleep there, ready to wake fast.

Question answered: when an instance changes models, is the new one woken (its weights in host
memory: vLLM sleep mode level 1, or a co-resident standby server) or loaded cold from disk, and
what happens to the one it leaves? `StandbyTier` keeps up to `capacity` sleeping models, most
recently served first: the model an instance leaves goes to sleep, and when the tier is full
the one served least recently goes cold. A profile's `wake_s` prices a wake, its `load_s` a
cold load (`Profile.load_time_s`).

A model may also be fetched into the tier while the instance serves another (`fetch`: its
weights read from disk into host memory, the GPU untouched): it sleeps there from `ready_at_s`
on, after the models served, in a free place (or in the place of a sleeping model it
replaces: the fleet's tiers then cover a tail model rather than a second copy of another).
Until then it is not asleep: a load of it is cold (and ends the fetch), and a model the
instance leaves takes its place if the tier has no other.
"""

from __future__ import annotations

from collections.abc import Iterable


class StandbyTier:
    def __init__(self, capacity: int, sleeping: Iterable[str] = ()) -> None:
        if capacity < 0:
            raise ValueError("standby capacity must be >= 0")
        self.capacity = capacity
        self._sleeping: list[str] = list(dict.fromkeys(sleeping))[:capacity]
        self._fetching: dict[str, float] = {}  # model -> when its weights are in place

    @property
    def models(self) -> tuple[str, ...]:
        """The sleeping models, most recently served first."""
        return tuple(self._sleeping)

    @property
    def fetching(self) -> tuple[str, ...]:
        return tuple(self._fetching)

    def settle(self, now_s: float) -> None:
        """Fetches done by now_s join the sleeping models (after those served)."""
        if not self._fetching:
            return  # the engine settles on every advance: nothing to do, nothing built
        for model, ready_at_s in list(self._fetching.items()):
            if ready_at_s <= now_s:
                del self._fetching[model]
                if model not in self._sleeping:
                    self._sleeping.append(model)
        del self._sleeping[self.capacity :]

    def fetch(self, model: str, ready_at_s: float, replacing: str | None = None) -> bool:
        """Start fetching `model` (asleep from ready_at_s) into a free place, after
        `replacing` (when it sleeps here) gives its place up; False, changing nothing, when
        it sleeps or is fetched already, or no place is free even so."""
        if model in self._sleeping or model in self._fetching:
            return False
        freed = replacing is not None and replacing in self._sleeping
        if len(self._sleeping) + len(self._fetching) - freed >= self.capacity:
            return False
        if replacing is not None and freed:
            self._sleeping.remove(replacing)
        self._fetching[model] = ready_at_s
        return True

    def fetched(self, model: str) -> bool:
        """The fetch of `model` is done now (a live engine knows when, not ahead): it sleeps
        after the models served. False when it gave its place up meanwhile."""
        if self._fetching.pop(model, None) is None:
            return False
        if model not in self._sleeping:
            self._sleeping.append(model)
        del self._sleeping[self.capacity :]
        return model in self._sleeping

    def drop_fetch(self, model: str) -> None:
        """The fetch of `model` failed or was called off: its place is free again."""
        self._fetching.pop(model, None)

    def sleep(self, model: str) -> None:
        """`model` leaves the GPU: it sleeps here (when the tier is full, a fetch still
        running gives way first, the last started first, then the least recently served
        model goes cold; with no capacity it goes cold itself). What an instance served
        outranks what it fetched: fetches only use places nothing served needs."""
        self._fetching.pop(model, None)
        if model in self._sleeping:
            self._sleeping.remove(model)
        self._sleeping.insert(0, model)
        while self._fetching and len(self._sleeping) + len(self._fetching) > self.capacity:
            del self._fetching[next(reversed(self._fetching))]
        del self._sleeping[self.capacity :]

    def wake(self, model: str) -> bool:
        """`model` is to serve: whether it was sleeping here (it leaves the tier; a fetch of
        it not done yet ends: it loads cold)."""
        self._fetching.pop(model, None)
        if model in self._sleeping:
            self._sleeping.remove(model)
            return True
        return False
