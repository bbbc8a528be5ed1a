"""SimulatedEngine: the engine model behind the EngineClient protocol, on a virtual clock.

The simulator owns the clock. It asks `next_event_at_s()` when the engine next changes on its
own, moves the clock there (or to an earlier event of its own), calls `advance_to(now_s)` and
reads what happened with `poll()` (which also advances to the clock's time). Operations
(submit, abort, swap, load) act at the clock's current time. No text is produced:
RequestFinished carries the token count only. `profiles` may be a Fleet; only those of the
instance's GPU type that fit it are used.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from qlm.clock import VirtualClock
from qlm.config.engine_config import EngineConfig
from qlm.engine.engine_types import EngineEvent, EngineObservation, EngineState, HandedOff
from qlm.engine.model.output_length import OUTPUT_LENGTHS, OutputLengthPolicy
from qlm.engine.model.shared import SharedEngineModel
from qlm.engine.model.stats import EngineStats
from qlm.perf.profile import Profile
from qlm.types import Fleet, Instance, Request


class SimulatedEngine:
    """One engine instance in simulated time (EngineClient)."""

    def __init__(
        self,
        instance: Instance,
        profiles: Fleet | Iterable[Profile],
        clock: VirtualClock,
        config: EngineConfig | None = None,
        output_length: str | OutputLengthPolicy = "cap",
        seed: int = 0,
    ) -> None:
        self.clock = clock
        self.model = SharedEngineModel(instance, profiles, config, start_s=clock.now_s())
        self._lengths = (
            OUTPUT_LENGTHS.create(output_length, seed=seed)
            if isinstance(output_length, str)
            else output_length
        )
        self._events: list[EngineEvent] = []

    @property
    def instance_id(self) -> str:
        return self.model.instance.id

    @property
    def stats(self) -> EngineStats:
        return self.model.stats

    @property
    def busy(self) -> bool:
        """Iterations are in flight: the engine uses its GPUs' compute."""
        return self.model.state is EngineState.READY and self.model.next_event_at_s() is not None

    @property
    def profile(self) -> Profile | None:
        """The profile of the model loaded or loading (None: no model)."""
        return self.model.profile

    @property
    def turns(self) -> int:
        return self.model.turns

    def take_turns(self, engines: int) -> None:
        """`engines` busy engines share this one's GPUs from now on (SharedEngineModel)."""
        self.model.take_turns(engines, self.clock.now_s())

    @property
    def kv_capacity_tokens(self) -> int:
        return self.model.kv_capacity_tokens

    def kv_held(self) -> int:
        return self.model.kv_held(self.clock.now_s())

    def lend_kv(self, capacity_tokens: int) -> None:
        self.model.lend_kv(capacity_tokens, self.clock.now_s())

    def next_event_at_s(self) -> float | None:
        """When the engine next changes on its own; None when idle (see EngineModel)."""
        return self.model.next_event_at_s()

    def advance_to(self, now_s: float) -> None:
        """Run the engine up to now_s; the events wait for poll()."""
        self._events.extend(self.model.advance_to(now_s))

    advance = advance_to

    def observe(self) -> EngineObservation:
        return self.model.observe(self.clock.now_s())

    def submit(self, request: Request) -> None:
        profile = self.model.profile
        length = None if profile is None else self._lengths.output_tokens(request, profile)
        self.model.add(request, self.clock.now_s(), output_tokens=length)

    def receive(self, request: Request, handed: HandedOff) -> None:
        """Take over a request a prefill engine handed off, with its KV (its output length
        drawn as on any engine: by request, not by where it runs)."""
        profile = self.model.profile
        length = None if profile is None else self._lengths.output_tokens(request, profile)
        self.model.add(request, self.clock.now_s(), output_tokens=length, received=handed)

    def abort(self, request_ids: Sequence[str]) -> None:
        self.model.abort(request_ids, self.clock.now_s())

    def swap_out(self, request_ids: Sequence[str]) -> None:
        self.model.swap_out(request_ids, self.clock.now_s())

    def swap_in(self, request_ids: Sequence[str]) -> None:
        self.model.swap_in(request_ids, self.clock.now_s())

    def load_model(self, model: str) -> None:
        self.model.load(model, self.clock.now_s())

    def fetch_standby(self, model: str, replacing: str | None = None) -> None:
        self.model.fetch_standby(model, self.clock.now_s(), replacing)

    def poll(self) -> list[EngineEvent]:
        """Events up to the clock's current time, in the order they happened."""
        self.advance_to(self.clock.now_s())
        events, self._events = self._events, []
        return events
