"""What the simulation runner keeps per request and per instance while a run goes on, and the
contract of the engines it drives (mutable, private to the runner's modules)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from qlm.clock import VirtualClock
from qlm.config import QlmConfig
from qlm.engine.client import EngineClient
from qlm.engine.engine_types import EngineState, HandedOff
from qlm.engine.model.stats import EngineStats
from qlm.sim.dependencies import Dependency
from qlm.sim.events import EventKey
from qlm.sim.result import OutcomeState, RequestOutcome
from qlm.types import Fleet, Instance, Request


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How long to run and what to record.

    max_time_s: stop at this virtual time. stall_s: stop when nothing happened for this long.
    sample_every_s: queue-length sampling period (None: span of arrivals / 2000, at least 1 s).
    """

    max_time_s: float = math.inf
    stall_s: float = 3600.0
    sample_every_s: float | None = None
    # requests that arrive when others end (a program's calls; qlm/sim/dependencies.py)
    dependencies: Mapping[str, Dependency] = field(default_factory=dict)

    def sample_period_s(self, requests: Sequence[Request]) -> float:
        """sample_every_s, or its default for these requests (sorted by arrival)."""
        if self.sample_every_s is not None:
            return self.sample_every_s
        return max(1.0, (requests[-1].arrival_at_s - requests[0].arrival_at_s) / 2000.0)


class SimEngine(EngineClient, Protocol):
    """An EngineClient on the virtual clock that the runner advances."""

    def next_event_at_s(self) -> float | None:
        """When the engine next has something to report (None: idle)."""
        ...

    @property
    def stats(self) -> EngineStats:
        """What the engine did since it was built."""
        ...

    def advance_to(self, at_s: float) -> None:
        """Run the engine up to virtual time at_s; its events wait in poll(). (Operations and
        poll() act at the clock's time and advance the engine there themselves.)"""
        ...

    def receive(self, request: Request, handed: HandedOff) -> None:
        """Take over a request a prefill engine handed off, with its KV (qlm/sim/handoff.py)."""
        ...


EngineFactory = Callable[[Instance, Fleet, VirtualClock, int], SimEngine]  # ..., seed


class SimulationError(RuntimeError):
    """A policy asked for something no engine can do (a policy bug)."""


MAX_ENGINE_ABORTS = 3  # an engine dropping a request this often on its own fails it


class Track:
    """One request's progress through the run (mutable, private to the runner)."""

    __slots__ = (
        "aborts",
        "class_index",
        "dispatch_s",
        "ended",
        "evictions",
        "finish_s",
        "first_token_s",
        "holder",
        "interrupted_s",
        "load_wait_s",
        "no_model_wait_s",
        "output_tokens",
        "queue_marks",
        "queue_wait_s",
        "request",
        "started",
        "state",
    )

    def __init__(self, request: Request, class_index: int) -> None:
        self.request = request
        self.class_index = class_index
        self.holder: Slot | None = None
        self.dispatch_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.output_tokens: int | None = None  # made in all, once it finished
        self.started = False  # the current attempt produced its first token
        self.evictions = 0
        self.aborts = 0
        self.ended = False
        self.state = OutcomeState.UNFINISHED
        self.interrupted_s: float | None = None  # first time an engine let it go
        # Before its first token (qlm/sim/waits.py): seconds in the global queue, and the parts
        # of them while its model was on no instance / only loading; queue_marks holds the
        # readings (since_s, no_model_s, loading_s) taken when it last entered the queue.
        self.queue_wait_s = 0.0
        self.no_model_wait_s = 0.0
        self.load_wait_s = 0.0
        self.queue_marks: tuple[float, float, float] | None = None


class Slot:
    """One instance and its engine."""

    __slots__ = (
        "engine",
        "evicting",
        "held",
        "id",
        "instance",
        "load_started_s",
        "loading",
        "max_num_seqs",
        "model",
        "wake_at_s",
        "wake_key",
    )

    def __init__(self, instance: Instance, engine: SimEngine) -> None:
        obs = engine.observe()
        self.instance = instance
        self.id = instance.id
        self.engine = engine
        self.held: dict[str, Track] = {}
        self.evicting: set[str] = set()
        self.model = obs.model
        self.loading = obs.state is EngineState.LOADING
        self.load_started_s = 0.0
        self.max_num_seqs = obs.max_num_seqs
        self.wake_at_s: float | None = None
        self.wake_key: EventKey | None = None


def outcome(track: Track) -> RequestOutcome:
    r = track.request
    return RequestOutcome(
        request_id=r.id,
        slo_class=r.slo_class,
        model=r.model,
        instance_id=None if track.holder is None else track.holder.id,
        arrival_s=r.arrival_at_s,
        dispatch_s=track.dispatch_s,
        first_token_s=track.first_token_s,
        finish_s=track.finish_s,
        ttft_deadline_s=r.ttft_deadline_at_s,
        completion_deadline_s=r.completion_deadline_at_s,
        evictions=track.evictions,
        state=track.state,
        queue_wait_s=track.queue_wait_s,
        no_model_wait_s=track.no_model_wait_s,
        load_wait_s=track.load_wait_s,
        interrupted_s=track.interrupted_s,
        output_tokens=track.output_tokens,
    )


def class_names(config: QlmConfig, requests: Sequence[Request]) -> tuple[str, ...]:
    names = [c.name for c in config.slo_classes]
    extra = sorted({r.slo_class for r in requests} - set(names))
    return (*names, *extra)


def prefix_tallies(slots: Iterable[Slot]) -> dict[str, tuple[int, int]]:
    """Per instance: prompt tokens admitted with a prefix, and of those, found cached."""
    return {
        slot.id: (slot.engine.stats.prefix_prompt_tokens, slot.engine.stats.prefix_hit_tokens)
        for slot in slots
    }
