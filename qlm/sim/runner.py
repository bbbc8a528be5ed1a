"""The simulation runner: a fleet of simulated engines on one virtual clock, driven by a policy.

`simulate(fleet, requests, policy_name, config, seed)` replays the requests (arrival order), lets
the named policy (qlm/sim/policies) answer every arrival, engine event and timer with LSOs, and
applies them to one SimulatedEngine per instance, exactly as the live agents apply them to real
engines. It returns a frozen SimResult.

Events (qlm/sim/events.py), at equal times in this order: engine progress, arrivals, policy
timers, queue-length samples. An engine is woken only at the time it reports as its next event
(`next_event_at_s`), so runs of identical decode steps cost one event. Arrivals are scheduled one
ahead, so the heap stays small however many requests there are.

The run ends when every request has ended, at `max_time_s`, or when nothing has happened for
`stall_s` of virtual time (requests no instance can serve); requests still open are UNFINISHED.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import numpy as np

from qlm.agents.actions import Action, Evict, KvDirection, LoadModel, Pull, SwapKv, lso_steps
from qlm.clock import Clock, VirtualClock, WallClock
from qlm.config import QlmConfig
from qlm.engine.client import EngineClient
from qlm.engine.config import EngineConfig
from qlm.engine.simulated import SimulatedEngine
from qlm.engine.types import (
    Aborted,
    EngineEvent,
    EngineFailed,
    EngineObservation,
    EngineState,
    FirstToken,
    ModelLoaded,
    RequestFinished,
)
from qlm.sim.events import EventKey, EventLoop, Priority, RandomStreams
from qlm.sim.policies import SimPolicy, make_policy
from qlm.sim.result import Attempt, LoadInterval, OutcomeState, QueueSample, RequestOutcome
from qlm.sim.result import SimResult as SimResult
from qlm.types import Fleet, Instance, Request

Progress = Callable[[int, int], None]  # (requests ended, requests in all)


class SimEngine(EngineClient, Protocol):
    """An EngineClient on the virtual clock that the runner advances."""

    def next_event_at_s(self) -> float | None:
        """When the engine next has something to report (None: idle)."""
        ...

    def advance_to(self, at_s: float) -> None:
        """Run the engine up to virtual time at_s; its events wait in poll(). (Operations and
        poll() act at the clock's time and advance the engine there themselves.)"""
        ...


EngineFactory = Callable[[Instance, Fleet, VirtualClock, int], SimEngine]  # ..., seed


class SimulationError(RuntimeError):
    """A policy asked for something no engine can do (a policy bug)."""


MAX_ENGINE_ABORTS = 3  # an engine dropping a request this often on its own fails it


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How long to run and what to record.

    max_time_s: stop at this virtual time. stall_s: stop when nothing happened for this long.
    sample_every_s: queue-length sampling period (None: span of arrivals / 2000, at least 1 s).
    """

    max_time_s: float = math.inf
    stall_s: float = 3600.0
    sample_every_s: float | None = None


def simulate(
    fleet: Fleet,
    requests: Sequence[Request],
    policy_name: str,
    config: QlmConfig,
    seed: int,
    *,
    progress: Progress | None = None,
    options: SimConfig | None = None,
    policy_options: Mapping[str, object] | None = None,
    engine_factory: EngineFactory | None = None,
) -> SimResult:
    """Run one policy over the requests on the fleet; same inputs and seed, same result."""
    policy = make_policy(policy_name, **dict(policy_options or {}))
    sim = Simulation(
        fleet,
        requests,
        policy,
        config,
        seed,
        options=options or SimConfig(),
        progress=progress,
        engine_factory=engine_factory or SimulatedEngines(),
    )
    return sim.run()


@dataclass(frozen=True, slots=True)
class SimulatedEngines:
    """The default EngineFactory: one SimulatedEngine per instance, with these scheduler
    settings and output-length policy ("cap": each request generates max_output_tokens;
    "profile": drawn per request from the seed the runner derives from the run's seed)."""

    config: EngineConfig | None = None
    output_length: str = "cap"

    def __call__(
        self, instance: Instance, fleet: Fleet, clock: VirtualClock, seed: int
    ) -> SimEngine:
        engine: SimEngine = SimulatedEngine(
            instance, fleet, clock, self.config, self.output_length, seed
        )
        return engine


default_engine_factory = SimulatedEngines()


class _Track:
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
        "request",
        "started",
        "state",
    )

    def __init__(self, request: Request, class_index: int) -> None:
        self.request = request
        self.class_index = class_index
        self.holder: _Slot | None = None
        self.dispatch_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.started = False  # the current attempt produced its first token
        self.evictions = 0
        self.aborts = 0
        self.ended = False
        self.state = OutcomeState.UNFINISHED


class _Slot:
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
        self.held: dict[str, _Track] = {}
        self.evicting: set[str] = set()
        self.model = obs.model
        self.loading = obs.state is EngineState.LOADING
        self.load_started_s = 0.0
        self.max_num_seqs = obs.max_num_seqs
        self.wake_at_s: float | None = None
        self.wake_key: EventKey | None = None


class Simulation:
    """One run. Implements the SimContext that policies see (qlm/sim/policies/base.py)."""

    def __init__(
        self,
        fleet: Fleet,
        requests: Sequence[Request],
        policy: SimPolicy,
        config: QlmConfig,
        seed: int,
        *,
        options: SimConfig,
        progress: Progress | None,
        engine_factory: EngineFactory,
    ) -> None:
        self._fleet = fleet
        self._config = config
        self._policy = policy
        self._seed = seed
        self._options = options
        self._progress = progress
        self._requests = sorted(requests, key=lambda r: r.arrival_at_s)  # stable
        ids = [r.id for r in self._requests]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids must be unique")
        self._loop = EventLoop(VirtualClock(self._requests[0].arrival_at_s if ids else 0.0))
        self._rng = RandomStreams(seed)
        self._classes = _class_names(config, self._requests)
        index = {c: k for k, c in enumerate(self._classes)}
        self._tracks = {r.id: _Track(r, index[r.slo_class]) for r in self._requests}
        self._waiting = [0] * len(self._classes)
        self._queued: dict[str, Request] = {}
        self._queued_view = MappingProxyType(self._queued)
        clock = self._loop.clock
        # One seed for every engine: a request's sampled output length (engine output-length
        # policy "profile") must not depend on where a policy runs it.
        engine_seed = self._rng.seed_for("engine")
        self._slots = {
            i.id: _Slot(i, engine_factory(i, fleet, clock, engine_seed)) for i in fleet.instances
        }
        self._dirty: dict[str, _Slot] = {}
        self._samples: list[QueueSample] = []
        self._loads: list[LoadInterval] = []
        self._interrupted: list[Attempt] = []
        self._swaps = dict.fromkeys(self._slots, 0)
        self._evictions = 0
        self._ended = 0
        self._last_progress_s = clock.now_s()
        self._progress_every = max(1, len(self._requests) // 1000)
        self._appliers: dict[type, Callable[[Action], None]] = {
            Pull: self._pull,
            Evict: self._evict,
            SwapKv: self._swap_kv,
            LoadModel: self._load_model,
        }
        self._handlers: dict[type, Callable[[_Slot, EngineEvent, list[Request]], None]] = {
            FirstToken: self._on_first_token,
            RequestFinished: self._on_finished,
            Aborted: self._on_aborted,
            ModelLoaded: self._on_model_loaded,
            EngineFailed: self._on_engine_failed,
        }

    # SimContext

    @property
    def fleet(self) -> Fleet:
        return self._fleet

    @property
    def config(self) -> QlmConfig:
        return self._config

    @property
    def clock(self) -> Clock:
        return self._loop.clock

    def queued(self) -> Mapping[str, Request]:
        return self._queued_view

    def observe(self, instance_id: str) -> EngineObservation:
        slot = self._slots[instance_id]
        self._dirty[slot.id] = slot  # observing may advance the engine: poll it afterwards
        return slot.engine.observe()

    def held(self, instance_id: str) -> int:
        return len(self._slots[instance_id].held)

    def model_of(self, instance_id: str) -> str | None:
        return self._slots[instance_id].model

    def loading(self, instance_id: str) -> bool:
        return self._slots[instance_id].loading

    def max_num_seqs(self, instance_id: str) -> int:
        return self._slots[instance_id].max_num_seqs

    def rng(self, component: str) -> np.random.Generator:
        return self._rng.generator(component)

    def call_at(self, at_s: float, tag: str) -> None:
        def fire() -> None:
            self._apply(self._policy.on_timer(tag))
            self._settle()

        self._loop.schedule(max(at_s, self._loop.now_s()), Priority.TIMER, fire)

    # The run

    def run(self) -> SimResult:
        wall = WallClock()
        started = wall.monotonic_s()
        self._apply(self._policy.start(self))
        self._settle()
        if self._requests:
            self._schedule_arrival(0)
            self._loop.schedule(self._loop.now_s(), Priority.SAMPLE, self._sample)
        self._loop.run(self._options.max_time_s)
        sim_wall_s = wall.monotonic_s() - started
        return self._result(sim_wall_s)

    def _schedule_arrival(self, index: int) -> None:
        request = self._requests[index]

        def arrive() -> None:
            if index + 1 < len(self._requests):
                self._schedule_arrival(index + 1)
            self._arrive(request)

        self._loop.schedule(request.arrival_at_s, Priority.ARRIVAL, arrive)

    def _arrive(self, request: Request) -> None:
        track = self._tracks[request.id]
        self._queued[request.id] = request
        self._waiting[track.class_index] += 1
        self._last_progress_s = self._loop.now_s()
        self._apply(self._policy.on_arrival(request))
        self._settle()

    def _wake(self, slot: _Slot) -> None:
        slot.wake_key = None
        slot.wake_at_s = None
        self._dirty[slot.id] = slot
        self._settle()

    def _settle(self) -> None:
        """Poll every engine touched since the last settle, hand their events to the policy,
        apply what it answers, until no engine has news; then re-arm their wake-ups."""
        touched: dict[str, _Slot] = {}
        dirty = self._dirty
        while dirty:
            slot_id = next(iter(dirty))
            slot = dirty.pop(slot_id)
            touched[slot_id] = slot
            events = slot.engine.poll()
            if events:
                self._collect(slot, events)
        for slot in touched.values():
            self._rearm(slot)

    def _rearm(self, slot: _Slot) -> None:
        at_s = slot.engine.next_event_at_s()
        if at_s == slot.wake_at_s:
            return
        if slot.wake_key is not None:
            self._loop.cancel(slot.wake_key)
            slot.wake_key = None
        slot.wake_at_s = at_s
        if at_s is not None:
            when = max(at_s, self._loop.now_s())
            slot.wake_key = self._loop.schedule(when, Priority.ENGINE, lambda: self._wake(slot))

    def _collect(self, slot: _Slot, events: Sequence[EngineEvent]) -> None:
        self._last_progress_s = self._loop.now_s()
        requeued: list[Request] = []
        handlers = self._handlers
        for event in events:
            handler = handlers.get(type(event))
            if handler is not None:
                handler(slot, event, requeued)
        if requeued:
            self._apply(self._policy.on_requeued(requeued))
        self._apply(self._policy.on_engine_events(slot.id, events))

    # Engine events

    def _on_first_token(self, slot: _Slot, event: EngineEvent, _: list[Request]) -> None:
        assert isinstance(event, FirstToken)
        track = slot.held.get(event.request_id)
        if track is None or track.started:
            return
        track.started = True
        self._waiting[track.class_index] -= 1
        if track.first_token_s is None:
            track.first_token_s = event.at_s

    def _on_finished(self, slot: _Slot, event: EngineEvent, _: list[Request]) -> None:
        assert isinstance(event, RequestFinished)
        track = slot.held.pop(event.request_id, None)
        if track is None:
            return
        slot.evicting.discard(event.request_id)
        if not track.started:
            self._waiting[track.class_index] -= 1
        if track.first_token_s is None:
            track.first_token_s = event.first_token_at_s
        track.finish_s = event.at_s
        self._end(track, OutcomeState.COMPLETED)

    def _on_aborted(self, slot: _Slot, event: EngineEvent, requeued: list[Request]) -> None:
        assert isinstance(event, Aborted)
        track = slot.held.pop(event.request_id, None)
        if track is None:
            return
        evicted = event.request_id in slot.evicting
        slot.evicting.discard(event.request_id)
        self._interrupted.append(
            Attempt(track.request.id, slot.id, track.dispatch_s or 0.0, event.at_s, event.reason)
        )
        track.holder = None
        if evicted:
            track.evictions += 1
            self._evictions += 1
        else:
            track.aborts += 1
            if track.aborts >= MAX_ENGINE_ABORTS:
                if not track.started:
                    self._waiting[track.class_index] -= 1
                self._end(track, OutcomeState.FAILED)
                return
        if track.started:
            track.started = False
            self._waiting[track.class_index] += 1
        self._queued[track.request.id] = track.request
        requeued.append(track.request)

    def _on_model_loaded(self, slot: _Slot, event: EngineEvent, _: list[Request]) -> None:
        assert isinstance(event, ModelLoaded)
        if slot.loading:
            self._loads.append(LoadInterval(slot.id, event.model, slot.load_started_s, event.at_s))
        slot.loading = False
        slot.model = event.model
        slot.max_num_seqs = slot.engine.observe().max_num_seqs

    def _on_engine_failed(self, slot: _Slot, event: EngineEvent, requeued: list[Request]) -> None:
        assert isinstance(event, EngineFailed)
        raise SimulationError(f"simulated engine {slot.id} failed: {event.reason}")

    # Actions

    def _apply(self, actions: Sequence[Action]) -> None:
        if not actions:
            return
        self._last_progress_s = self._loop.now_s()
        for action in actions:
            for step in self._steps(action):
                self._appliers[type(step)](step)

    def _steps(self, action: Action) -> tuple[Action, ...]:
        """The primitives an action comes down to (qlm.agents.actions.lso_steps, the rules
        the live agents follow too)."""
        if not isinstance(action, LoadModel):
            return (action,)
        slot = self._slot_for(action)
        return lso_steps((action,), tuple(slot.held), slot.model, slot.loading)

    def _slot_for(self, action: Pull | Evict | SwapKv | LoadModel) -> _Slot:
        slot = self._slots.get(action.instance_id)
        if slot is None:
            raise SimulationError(f"{action}: unknown instance")
        self._dirty[slot.id] = slot
        return slot

    def _pull(self, action: Action) -> None:
        assert isinstance(action, Pull)
        slot = self._slot_for(action)
        if slot.loading or slot.model is None:
            raise SimulationError(f"{action}: instance {slot.id} is not ready")
        now_s = self._loop.now_s()
        for request_id in action.request_ids:
            request = self._queued.pop(request_id, None)
            if request is None:
                continue  # taken meanwhile; the live queue's pull answers the same way
            if request.model != slot.model:
                raise SimulationError(f"{action}: {request_id} needs {request.model}")
            track = self._tracks[request_id]
            track.holder = slot
            track.dispatch_s = now_s
            slot.held[request_id] = track
            slot.engine.submit(request)

    def _evict(self, action: Action) -> None:
        assert isinstance(action, Evict)
        slot = self._slot_for(action)
        ids = [r for r in action.request_ids if r in slot.held and r not in slot.evicting]
        if ids:
            slot.evicting.update(ids)
            slot.engine.abort(ids)

    def _swap_kv(self, action: Action) -> None:
        assert isinstance(action, SwapKv)
        slot = self._slot_for(action)
        ids = [r for r in action.request_ids if r in slot.held]
        if not ids:
            return
        if action.direction is KvDirection.TO_CPU:
            slot.engine.swap_out(ids)
        else:
            slot.engine.swap_in(ids)

    def _load_model(self, action: Action) -> None:
        assert isinstance(action, LoadModel)
        slot = self._slot_for(action)
        if not self._fleet.can_serve(slot.instance, action.model):
            raise SimulationError(f"{action}: instance cannot hold {action.model}")
        slot.engine.load_model(action.model)  # lso_steps evicted what it held
        slot.model = action.model
        slot.loading = True
        slot.load_started_s = self._loop.now_s()
        self._swaps[slot.id] += 1

    # Bookkeeping

    def _end(self, track: _Track, state: OutcomeState) -> None:
        track.state = state
        track.ended = True
        self._ended += 1
        if self._ended == len(self._requests):
            self._loop.stop()
        if self._progress is not None and (
            self._ended % self._progress_every == 0 or self._ended == len(self._requests)
        ):
            self._progress(self._ended, len(self._requests))

    def _sample(self) -> None:
        """Record queue lengths; also where a stalled run is stopped (nothing happened for
        stall_s: requests that no instance will ever serve)."""
        now_s = self._loop.now_s()
        self._samples.append(QueueSample(now_s, tuple(self._waiting)))
        if now_s - self._last_progress_s > self._options.stall_s:
            self._loop.stop()
        elif self._ended < len(self._requests):
            self._loop.schedule(now_s + self._sample_every_s(), Priority.SAMPLE, self._sample)

    def _sample_every_s(self) -> float:
        if self._options.sample_every_s is not None:
            return self._options.sample_every_s
        span_s = self._requests[-1].arrival_at_s - self._requests[0].arrival_at_s
        return max(1.0, span_s / 2000.0)

    def _result(self, sim_wall_s: float) -> SimResult:
        start_s = self._requests[0].arrival_at_s if self._requests else 0.0
        return SimResult(
            policy=self._policy.name,
            seed=self._seed,
            slo_classes=self._classes,
            outcomes=tuple(_outcome(t) for t in self._tracks.values()),
            interrupted=tuple(self._interrupted),
            loads=tuple(self._loads),
            swaps=self._swaps,
            evictions=self._evictions,
            queue_samples=tuple(self._samples),
            events_processed=self._loop.processed,
            start_s=start_s,
            end_s=self._loop.now_s(),
            sim_wall_s=sim_wall_s,
            policy_stats=self._policy.stats(),
            planner_wall_s=self._policy.wall_s(),
        )


def _outcome(track: _Track) -> RequestOutcome:
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
    )


def _class_names(config: QlmConfig, requests: Sequence[Request]) -> tuple[str, ...]:
    names = [c.name for c in config.slo_classes]
    extra = sorted({r.slo_class for r in requests} - set(names))
    return (*names, *extra)
