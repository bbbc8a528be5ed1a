"""One simulation run: the event loop that drives a policy and a fleet of simulated engines on
one virtual clock (see qlm/sim/simulate.py for the order of events and when a run ends). The run
implements the SimContext policies see (qlm/sim/policies/policy_base.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import MappingProxyType

import numpy as np

from qlm.agents.actions import Action
from qlm.clock import Clock, VirtualClock, WallClock
from qlm.config import QlmConfig
from qlm.engine.engine_types import (
    Aborted,
    EngineEvent,
    EngineFailed,
    EngineObservation,
    FirstToken,
    HandedOff,
    ModelLoaded,
    RequestFinished,
)
from qlm.sim.dependencies import Releases
from qlm.sim.events import EventLoop, Priority, RandomStreams
from qlm.sim.handoff import Handoffs
from qlm.sim.lso import LsoApplier
from qlm.sim.policies import SimPolicy
from qlm.sim.result import Attempt, LoadInterval, OutcomeState, QueueSample, SimResult
from qlm.sim.sharing import SharedGpus
from qlm.sim.tracking import (
    MAX_ENGINE_ABORTS,
    EngineFactory,
    SimConfig,
    SimulationError,
    Slot,
    Track,
    class_names,
    outcome,
    prefix_tallies,
)
from qlm.sim.waits import WaitLedger
from qlm.types import Fleet, Request

Progress = Callable[[int, int], None]  # (requests ended, requests in all)


class Simulation:
    """One run. Implements the SimContext that policies see (qlm/sim/policies/policy_base.py)."""

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
        self._releases = Releases(self._requests, options.dependencies)
        self._arrivals = self._releases.roots()  # the others arrive as their inputs end
        self._loop = EventLoop(VirtualClock(self._requests[0].arrival_at_s if ids else 0.0))
        self._rng = RandomStreams(seed)
        self._classes = class_names(config, self._requests)
        index = {c: k for k, c in enumerate(self._classes)}
        self._tracks = {r.id: Track(r, index[r.slo_class]) for r in self._requests}
        self._waiting = [0] * len(self._classes)
        self._queued: dict[str, Request] = {}
        self._queued_view = MappingProxyType(self._queued)
        clock = self._loop.clock
        # One engine seed: sampled output lengths must not depend on where a request runs.
        engine_seed = self._rng.seed_for("engine")
        self._slots = {
            i.id: Slot(i, engine_factory(i, fleet, clock, engine_seed)) for i in fleet.instances
        }
        self._dirty: dict[str, Slot] = {}
        self._shared = SharedGpus(self._slots.values())
        self._samples: list[QueueSample] = []
        self._loads: list[LoadInterval] = []
        self._interrupted: list[Attempt] = []
        self._swaps = dict.fromkeys(self._slots, 0)
        self._ledger = WaitLedger(clock, self._slots.values())
        self._lso = LsoApplier(
            fleet,
            self._slots,
            self._queued,
            self._tracks,
            self._dirty,
            self._swaps,
            clock,
            self._ledger,
        )
        self._evictions = 0
        self._ended = 0
        self._last_progress_s = clock.now_s()
        self._progress_every = max(1, len(self._requests) // 1000)
        self._handlers = self._event_handlers()

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

    def serving(self, model: str) -> tuple[str, ...]:
        return self._ledger.serving(model)

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
        if self._arrivals:
            self._schedule_arrival(0)
            self._loop.schedule(self._loop.now_s(), Priority.SAMPLE, self._sample)
        self._loop.run(self._options.max_time_s)
        sim_wall_s = wall.monotonic_s() - started
        return self._result(sim_wall_s)

    def _schedule_arrival(self, index: int) -> None:
        request = self._arrivals[index]

        def arrive() -> None:
            if index + 1 < len(self._arrivals):
                self._schedule_arrival(index + 1)
            self._arrive(request)

        self._loop.schedule(request.arrival_at_s, Priority.ARRIVAL, arrive)

    def _arrive(self, request: Request) -> None:
        track = self._tracks[request.id]
        self._queued[request.id] = request
        self._ledger.enqueue(track)
        self._waiting[track.class_index] += 1
        self._last_progress_s = self._loop.now_s()
        self._apply(self._policy.on_arrival(request))
        self._settle()

    def _wake(self, slot: Slot) -> None:
        slot.wake_key = None
        slot.wake_at_s = None
        self._poll_now(slot)

    def _poll_now(self, slot: Slot) -> None:
        self._dirty[slot.id] = slot
        self._settle()

    def _settle(self) -> None:
        """Poll every engine touched since the last settle, hand their events to the policy,
        apply what it answers, until no engine has news; then re-arm their wake-ups."""
        touched: dict[str, Slot] = {}
        dirty = self._dirty
        while dirty:
            slot_id = next(iter(dirty))
            slot = dirty.pop(slot_id)
            touched[slot_id] = slot
            events = slot.engine.poll()
            if events:
                self._collect(slot, events)
            if not dirty:  # engines sharing GPUs with those touched may change speed
                dirty.update((s.id, s) for s in self._shared.retime(touched))
        for slot in touched.values():
            self._rearm(slot)

    def _rearm(self, slot: Slot) -> None:
        at_s = slot.engine.next_event_at_s()
        if at_s == slot.wake_at_s:
            return
        if slot.wake_key is not None:
            self._loop.cancel(slot.wake_key)
            slot.wake_key = None
        slot.wake_at_s = at_s
        if at_s is not None:
            when = max(at_s, self._loop.now_s())
            slot.wake_key = self._loop.schedule(when, Priority.ENGINE, partial(self._wake, slot))

    def _collect(self, slot: Slot, events: Sequence[EngineEvent]) -> None:
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

    def _event_handlers(self) -> dict[type, Callable[[Slot, EngineEvent, list[Request]], None]]:
        return {
            FirstToken: self._on_first_token,
            RequestFinished: self._on_finished,
            Aborted: self._on_aborted,
            ModelLoaded: self._on_model_loaded,
            EngineFailed: self._on_engine_failed,
            HandedOff: self._handoffs().on_handed_off,
        }

    def _on_first_token(self, slot: Slot, event: EngineEvent, _: list[Request]) -> None:
        assert isinstance(event, FirstToken)
        track = slot.held.get(event.request_id)
        if track is None or track.started:
            return
        track.started = True
        self._waiting[track.class_index] -= 1
        if track.first_token_s is None:
            track.first_token_s = event.at_s

    def _on_finished(self, slot: Slot, event: EngineEvent, _: list[Request]) -> None:
        assert isinstance(event, RequestFinished)
        track = slot.held.pop(event.request_id, None)
        if track is None:
            return
        slot.evicting.discard(event.request_id)
        if not track.started:
            self._waiting[track.class_index] -= 1
        if track.first_token_s is None:
            track.first_token_s = event.first_token_at_s
        track.finish_s, track.output_tokens = event.at_s, event.output_tokens
        self._end(track, OutcomeState.COMPLETED)

    def _on_aborted(self, slot: Slot, event: EngineEvent, requeued: list[Request]) -> None:
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
        if track.interrupted_s is None:
            track.interrupted_s = event.at_s
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
        self._ledger.enqueue(track)
        requeued.append(track.request)

    def _handoffs(self) -> Handoffs:
        """The carrier of prefill instances' hand-offs (qlm/sim/handoff.py)."""
        paths = (self._on_aborted, self._requeued_now, self._poll_now)
        return Handoffs(self._slots, self._loop, self._fleet, self._policy.decode_target, *paths)

    def _requeued_now(self, requeued: list[Request]) -> None:
        """Requests back in the queue outside an engine's events (a hand-off that failed)."""
        self._apply(self._policy.on_requeued(requeued))
        self._settle()

    def _on_model_loaded(self, slot: Slot, event: EngineEvent, _: list[Request]) -> None:
        assert isinstance(event, ModelLoaded)
        if slot.loading:
            self._loads.append(LoadInterval(slot.id, event.model, slot.load_started_s, event.at_s))
        slot.loading = False
        slot.model = event.model
        slot.max_num_seqs = slot.engine.observe().max_num_seqs
        self._ledger.slot_changed(slot)

    def _on_engine_failed(self, slot: Slot, event: EngineEvent, requeued: list[Request]) -> None:
        assert isinstance(event, EngineFailed)
        raise SimulationError(f"simulated engine {slot.id} failed: {event.reason}")

    # Actions

    def _apply(self, actions: Sequence[Action]) -> None:
        if not actions:
            return
        self._last_progress_s = self._loop.now_s()
        self._lso.apply(actions)

    # Bookkeeping

    def _end(self, track: Track, state: OutcomeState) -> None:
        track.state = state
        track.ended = True
        self._ended += 1
        now_s = self._loop.now_s()
        released, failed = self._releases.ended(
            track.request.id, state is OutcomeState.COMPLETED, now_s
        )
        for request in released:
            self._tracks[request.id].request = request
            self._loop.schedule(
                request.arrival_at_s, Priority.ARRIVAL, partial(self._arrive, request)
            )
        for request_id in failed:  # an input failed: it never arrives
            self._end(self._tracks[request_id], OutcomeState.FAILED)
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
            period_s = self._options.sample_period_s(self._requests)
            self._loop.schedule(now_s + period_s, Priority.SAMPLE, self._sample)

    def _result(self, sim_wall_s: float) -> SimResult:
        start_s = self._requests[0].arrival_at_s if self._requests else 0.0
        for track in self._tracks.values():
            self._ledger.dequeue(track)  # close the waits still open
        return SimResult(
            policy=self._policy.name,
            seed=self._seed,
            slo_classes=self._classes,
            outcomes=tuple(outcome(t) for t in self._tracks.values()),
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
            ttft_predictions=self._policy.ttft_predictions(),
            prefix_tokens=prefix_tallies(self._slots.values()),
        )
