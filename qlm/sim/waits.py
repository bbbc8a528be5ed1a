"""Where a request's wait before its first token went, as the runner sees it: seconds in the
global queue, and the parts of them while its model was on no instance (neither loaded nor
loading) or only loading somewhere. These are the facts the miss causes are classified from
(qlm/sim/miss_causes.py), whatever the policy.

Per model the ledger keeps two running integrals over virtual time, seconds "absent" (no
instance has it loaded or is loading it) and seconds "loading" (one is loading it, none has it
loaded); a request's share of each is the difference of two readings, taken when it enters the
queue and when it leaves it. A model no instance has held yet reads as absent since time 0.
"""

from __future__ import annotations

from collections.abc import Iterable

from qlm.clock import Clock
from qlm.sim.tracking import Slot, Track


class _Model:
    """One model's instance counts and its two integrals up to since_s."""

    __slots__ = ("absent_s", "loaded", "loading", "loading_s", "since_s")

    def __init__(self, now_s: float) -> None:
        self.loaded = 0  # instances with it loaded
        self.loading = 0  # instances loading it
        self.absent_s = now_s  # absent since time 0 until first seen
        self.loading_s = 0.0
        self.since_s = now_s

    def readings(self, now_s: float) -> tuple[float, float]:
        """(absent_s, loading_s) integrated up to now_s."""
        elapsed_s = now_s - self.since_s
        if self.loaded:
            return self.absent_s, self.loading_s
        if self.loading:
            return self.absent_s, self.loading_s + elapsed_s
        return self.absent_s + elapsed_s, self.loading_s

    def flush(self, now_s: float) -> None:
        self.absent_s, self.loading_s = self.readings(now_s)
        self.since_s = now_s


class WaitLedger:
    """Model availability over time, and each request's queue time before its first token."""

    def __init__(self, clock: Clock, slots: Iterable[Slot]) -> None:
        self._clock = clock
        self._models: dict[str, _Model] = {}
        self._held: dict[str, tuple[str | None, bool]] = {}  # slot id -> (model, loading)
        self._serving: dict[str, tuple[str, ...]] = {}  # model -> `serving`, while it stands
        for slot in slots:
            self.slot_changed(slot)

    def _model(self, name: str, now_s: float) -> _Model:
        model = self._models.get(name)
        if model is None:
            model = self._models[name] = _Model(now_s)
        return model

    def _readings(self, name: str, now_s: float) -> tuple[float, float]:
        model = self._models.get(name)
        return (now_s, 0.0) if model is None else model.readings(now_s)

    def serving(self, model: str) -> tuple[str, ...]:
        """The instances with `model` loaded (not loading), in fleet order."""
        pool = self._serving.get(model)
        if pool is None:
            held = self._held.items()
            pool = tuple(i for i, (m, loading) in held if m == model and not loading)
            self._serving[model] = pool
        return pool

    def slot_changed(self, slot: Slot) -> None:
        """Record the slot's model and loading flag as they are now."""
        now_s = self._clock.now_s()
        new = (slot.model, slot.loading)
        old = self._held.get(slot.id, (None, False))
        if new == old:
            return
        self._held[slot.id] = new
        self._serving.clear()
        for name, loading, step in ((old[0], old[1], -1), (new[0], new[1], 1)):
            if name is None:
                continue
            model = self._model(name, now_s)
            model.flush(now_s)
            if loading:
                model.loading += step
            else:
                model.loaded += step

    def enqueue(self, track: Track) -> None:
        """The request enters the global queue (arrival or requeue); counted until its first
        token only."""
        if track.first_token_s is not None:
            return
        now_s = self._clock.now_s()
        absent_s, loading_s = self._readings(track.request.model, now_s)
        track.queue_marks = (now_s, absent_s, loading_s)

    def dequeue(self, track: Track) -> None:
        """The request leaves the global queue (dispatched, or the run ends)."""
        marks = track.queue_marks
        if marks is None:
            return
        track.queue_marks = None
        now_s = self._clock.now_s()
        absent_s, loading_s = self._readings(track.request.model, now_s)
        track.queue_wait_s += now_s - marks[0]
        track.no_model_wait_s += absent_s - marks[1]
        track.load_wait_s += loading_s - marks[2]
