"""EngineModel: an iteration-level continuous-batching engine (vLLM-like), pure and clockless.

Question answered: what does an engine serving these requests do, iteration by iteration, on
passed-in time? This module is the facade: the engine's state (EMPTY, LOADING, READY), time,
the operations and the observation; its parts (sequence.py, seq_queues.py, decode_batch.py,
kv_cache.py, scheduler.py, segment.py, engine_config.py, stats.py, tiers.py) are listed with the
question each answers in qlm/engine/README.md.

Time: `advance_to(t)` completes every segment that ends by t and plans the next one at its end;
an operation (add, abort, swap_out, swap_in) arriving mid-segment first cuts it: the decode
steps completed by then are applied, the step in flight completes with its duration and its
remaining members, and the next iteration sees the change. An operation within TIME_EPS_S of an
iteration boundary acts at that boundary. `load` kills everything at once (Aborted events),
serves nothing for the load time (wake_s or load_s, by tier), then emits ModelLoaded.
An engine on GPUs it shares with others is a SharedEngineModel (shared.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from qlm.config.engine_config import EngineConfig
from qlm.engine.engine_profiles import profiles_for
from qlm.engine.engine_types import (
    Aborted,
    EngineError,
    EngineEvent,
    EngineObservation,
    EngineState,
    HandedOff,
    ModelLoaded,
)
from qlm.engine.model.scheduler import complete, schedule
from qlm.engine.model.segment import Segment, plan_segment
from qlm.engine.model.seq_queues import SeqQueues
from qlm.engine.model.sequence import Seq, SeqPhase
from qlm.engine.model.stats import EngineCounters, EngineStats
from qlm.engine.model.tiers import StandbyTier
from qlm.perf.profile import Profile
from qlm.perf.step import TIME_EPS_S, DecodeRun
from qlm.types import Fleet, Instance, InstanceRole, Request


class EngineModel:
    """A continuous-batching engine on passed-in time. See the module docstring."""

    _queues: SeqQueues
    _carry_preempted: bool  # a plan discarded at its start had preempted
    _segment: Segment | None  # iterations in flight
    _seq_limit: int  # KV tokens of the instance's own memory: no sequence grows past them

    def __init__(
        self,
        instance: Instance,
        profiles: Fleet | Iterable[Profile],
        config: EngineConfig | None = None,
        start_s: float = 0.0,
    ) -> None:
        self.instance = instance
        self.config = config if config is not None else EngineConfig()
        self._profiles = profiles_for(instance, profiles)
        self._now_s = start_s
        self._events: list[EngineEvent] = []
        self._counters = EngineCounters()
        self._order = 0
        self._observed: EngineObservation | None = None  # the last, while nothing changed
        self._reset_queues()
        self._state = EngineState.EMPTY
        self._model: str | None = None
        self._profile: Profile | None = None
        self._load_done_at_s: float | None = None
        self._load_s = 0.0  # the load in progress: a wake from standby or a cold load
        self._tier = StandbyTier(self.config.standby_models, instance.standby_models)
        self._max_num_seqs = 1
        if instance.loaded_model is not None:
            self._install(instance.loaded_model)
            self._state = EngineState.READY

    # ------------------------------------------------------------------ queries

    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def model(self) -> str | None:
        return self._model

    @property
    def profile(self) -> Profile | None:
        return self._profile

    @property
    def kv_capacity_tokens(self) -> int:
        return self._queues.kv.capacity_tokens

    @property
    def max_num_seqs(self) -> int:
        return self._max_num_seqs

    @property
    def now_s(self) -> float:
        """The latest time the model has been advanced to."""
        return self._now_s

    @property
    def stats(self) -> EngineStats:
        return self._counters.snapshot()

    def models(self) -> tuple[str, ...]:
        """Models this engine can load (a profile exists and it fits the instance)."""
        return tuple(sorted(self._profiles))

    def next_event_at_s(self) -> float | None:
        """When the engine's state next changes on its own (the end of the iterations in
        flight, or of a model load); None when idle. Advancing there may produce no event
        (a prefill chunk that does not finish a prompt); ask again afterwards."""
        if self._state is EngineState.LOADING:
            return self._load_done_at_s
        return None if self._segment is None else self._segment.end_s

    def observe(self, now_s: float) -> EngineObservation:
        """The engine at now_s (advancing to it first; events stay buffered for
        advance_to), counting the decode steps done inside the run in flight."""
        self._advance(now_s)
        if self._observed is not None and self._observed.at_s == now_s:
            return self._observed  # nothing changed since (operations and _advance reset it)
        done = self._decode_steps_in_flight(now_s)
        queues = self._queues
        self._observed = EngineObservation(
            instance_id=self.instance.id,
            state=self._state,
            model=self._model,
            requests=queues.views(done),
            # cached prefix blocks no sequence references are room, not use
            kv_used_tokens=queues.kv.used_tokens
            - queues.prefix.idle_tokens
            + done * queues.decode.num_seqs,
            kv_capacity_tokens=queues.kv.capacity_tokens,
            max_num_seqs=self._max_num_seqs,
            supports_kv_swap=self.config.supports_kv_swap,
            at_s=now_s,
            prefix_prompt_tokens=self._counters.prefix.prompt_tokens,
            prefix_hit_tokens=self._counters.prefix.hit_tokens,
            standby_models=self._tier.models,
            fetching_models=self._tier.fetching,
            standby_capacity=self._tier.capacity,
        )
        return self._observed

    # ------------------------------------------------------------------ time

    def advance_to(self, t_s: float) -> list[EngineEvent]:
        """Run the engine up to t_s; return the events since the last call, in time order."""
        self._advance(t_s)
        events, self._events = self._events, []
        return events

    # ------------------------------------------------------------------ operations

    def add(
        self,
        request: Request,
        now_s: float,
        output_tokens: int | None = None,
        received: HandedOff | None = None,
    ) -> None:
        """Admit a request into the engine's waiting queue. It generates output_tokens tokens
        (default: request.max_output_tokens), capped by max_output_tokens and by the KV
        capacity (a sequence never outgrows the cache, like vLLM's max_model_len).
        `received`: a prefill engine's hand-off; the request comes with its KV and its first
        token made, and is admitted like one resuming (only its last token is computed)."""
        self._begin(now_s)
        self._check_can_add(request)
        capacity = self._seq_limit  # the longest sequence (its own memory, however lent)
        if request.prompt_tokens + 1 > capacity:
            self._counters.aborted += 1
            self._events.append(Aborted(request.id, now_s, "prompt exceeds the KV capacity"))
            return
        seq = Seq.for_request(request, self._order, capacity, output_tokens, received)
        seq.queued_iteration = self._counters.iterations
        self._order += 1
        self._queues.seqs[request.id] = seq
        plan_s = self._interrupt(now_s)
        self._queues.enqueue(seq, front=False)
        self._resume(plan_s)

    def abort(self, request_ids: Sequence[str], now_s: float, reason: str = "aborted") -> None:
        """Drop requests at once (Aborted events at now_s) and free their KV. Unknown or
        already ended ids are ignored."""
        self._begin(now_s)
        seqs = self._known(request_ids)
        if not seqs:
            return
        plan_s = self._interrupt(now_s)
        for seq in seqs:
            self._queues.drop(seq)
            self._counters.aborted += 1
            self._events.append(Aborted(seq.id, now_s, reason))
        self._resume(plan_s)

    def swap_out(self, request_ids: Sequence[str], now_s: float) -> None:
        """Move requests' KV to CPU; they pause until swap_in. A waiting request pauses with
        no KV. EngineError without swap support or when the CPU space is short."""
        self._begin(now_s)
        if not self.config.supports_kv_swap:
            raise EngineError(f"engine {self.instance.id}: KV swapping is off")
        seqs = self._known(request_ids)
        plan_s = self._interrupt(now_s)
        queues = self._queues
        need = sum(queues.gpu_tokens(s) for s in seqs if s.phase is not SeqPhase.SWAPPED)
        if need > queues.kv.cpu_free_tokens:
            self._resume(plan_s)
            raise EngineError(
                f"engine {self.instance.id}: {need} KV tokens do not fit the CPU swap space "
                f"({queues.kv.cpu_free_tokens} free)"
            )
        queues.pause(seqs)
        self._resume(plan_s)

    def swap_in(self, request_ids: Sequence[str], now_s: float) -> None:
        """Let swapped requests resume: their KV returns when there is room (before any
        waiting request is admitted). Requests that are not swapped are ignored."""
        self._begin(now_s)
        seqs = self._known(request_ids)
        plan_s = self._interrupt(now_s)
        self._queues.resume(seqs)
        self._resume(plan_s)

    def load(self, model: str, now_s: float) -> None:
        """Switch models: abort every request, serve nothing for the load time (by tier), emit
        ModelLoaded; the model left sleeps. EngineError for a model it cannot serve."""
        self._begin(now_s)
        if model == self._model and self._state in (EngineState.LOADING, EngineState.READY):
            return  # it serves or loads it already: nothing to do (not a cold restart)
        if model not in self._profiles:
            raise EngineError(
                f"engine {self.instance.id} cannot load {model!r}; "
                f"it has profiles that fit for: {', '.join(self.models()) or 'none'}"
            )
        for seq in list(self._queues.seqs.values()):
            self._queues.drop(seq)
            self._counters.aborted += 1
            self._events.append(Aborted(seq.id, now_s, f"model load ({model})"))
        self._reset_queues()
        standby = self._tier.wake(model)  # before the model left takes its place
        if self._model is not None:
            self._tier.sleep(self._model)
        self._install(model)
        self._state = EngineState.LOADING
        assert self._profile is not None
        self._load_s = self._profile.load_time_s(standby)
        self._load_done_at_s = now_s + self._load_s
        self._advance(now_s)  # a zero load time completes at once

    def fetch_standby(self, model: str, now_s: float, replacing: str | None = None) -> None:
        """Read `model`'s weights into a free place of the standby tier while serving (it
        sleeps there its profile's load_s later; `replacing` gives its place up first;
        StandbyTier.fetch)."""
        self._begin(now_s)
        profile = self._profiles.get(model)
        if profile is None:
            raise EngineError(f"engine {self.instance.id} cannot hold {model!r}")
        self._tier.fetch(model, now_s + profile.load_s, replacing)

    # ------------------------------------------------------------------ time, inside

    def _begin(self, now_s: float) -> None:
        """Before an operation at now_s: advance to it; the last observation goes stale."""
        self._advance(now_s)
        self._observed = None

    def _advance(self, t_s: float) -> None:
        if t_s < self._now_s - TIME_EPS_S:
            raise ValueError(f"engine {self.instance.id}: time went back ({t_s} < {self._now_s})")
        self._tier.settle(t_s)
        while True:
            if self._state is EngineState.LOADING:
                done_at = self._load_done_at_s
                assert done_at is not None
                if done_at > t_s:
                    break
                self._finish_load(done_at)
                continue
            seg = self._segment
            if seg is None or seg.end_s > t_s:
                break
            self._segment = None
            self._observed = None
            complete(self._queues, seg, seg.steps, self._events)
            self._now_s = max(self._now_s, seg.end_s)
            self._schedule(seg.end_s)
        self._now_s = max(self._now_s, t_s)

    def _finish_load(self, at_s: float) -> None:
        assert self._model is not None
        assert self._profile is not None
        self._state = EngineState.READY
        self._observed = None
        self._load_done_at_s = None
        self._events.append(ModelLoaded(self._model, at_s, self._load_s))
        self._now_s = max(self._now_s, at_s)
        self._schedule(at_s)

    def _interrupt(self, now_s: float) -> float:
        """Before an operation at now_s: apply the decode steps of the segment in flight that
        are complete and keep only the step in flight. Returns when a new plan starts if the
        engine stops iterating here: now_s, or the boundary that now_s falls on (within
        TIME_EPS_S), so that operations at a boundary act exactly there."""
        seg = self._segment
        if seg is None:
            return now_s
        done = seg.steps_done_by(now_s)
        if done == 0 and now_s <= seg.start_s + TIME_EPS_S:
            self._discard(seg)  # it has just begun: plan again with the operation's effect
            return seg.start_s
        if seg.chunks:  # a single mixed iteration stays in flight
            return now_s
        if done > 0:
            complete(self._queues, seg, done, self._events)
        boundary_s = seg.start_s + seg.run.duration_s(done)
        if now_s <= boundary_s + TIME_EPS_S:
            self._segment = None
            return boundary_s
        step = DecodeRun(seg.run.step_s(done))
        self._segment = Segment(boundary_s, 1, step)
        return now_s

    def _discard(self, seg: Segment) -> None:
        """Drop a plan made at this very instant; the next plan inherits what it did to the
        queues (admissions, preemptions, swaps), so it also inherits its flags."""
        self._segment = None
        self._carry_preempted = seg.preempted
        self._queues.kv.swap_traffic_tokens += seg.swap_tokens

    def _resume(self, plan_s: float) -> None:
        """After an operation: drop an iteration in flight that has no members left, and
        start iterating if the engine is idle."""
        seg = self._segment
        emptied = seg is not None and self._queues.decode.num_seqs == 0
        if emptied and seg is not None and all(c.seq.version != c.version for c in seg.chunks):
            self._segment = None
        if self._segment is None and self._state is EngineState.READY:
            self._schedule(plan_s)

    def _decode_steps_in_flight(self, now_s: float) -> int:
        seg = self._segment
        if seg is None or seg.chunks:
            return 0
        return seg.steps_done_by(now_s)

    def _schedule(self, at_s: float) -> None:
        """Plan the next iteration(s) at at_s, or go idle."""
        self._segment = None
        if self._state is not EngineState.READY:
            return
        assert self._profile is not None
        plan = schedule(
            self._queues, self.config.chunk_tokens, self._max_num_seqs, self._carry_preempted
        )
        self._carry_preempted = False
        self._segment = plan_segment(
            at_s,
            plan.chunks,
            plan.preempted,
            self._queues,
            self._profile,
            self.config.swap_bytes_per_s,
        )

    # ------------------------------------------------------------------ state, inside

    def _install(self, model: str) -> None:
        profile = self._profiles[model]
        self._model = model
        self._profile = profile
        self._seq_limit = profile.kv_capacity_tokens(self.instance.gpu_memory_bytes)
        self._queues.kv.capacity_tokens = self._seq_limit
        # Every running sequence must fit one iteration's token budget.
        wanted = self.config.max_num_seqs or profile.max_batch_size
        self._max_num_seqs = min(wanted, self.config.chunk_tokens)

    def _reset_queues(self) -> None:
        self._queues = SeqQueues(self.config, self._counters)
        self._queues.hands_off = self.instance.role is InstanceRole.PREFILL
        self._carry_preempted = False
        self._segment = None

    def _check_can_add(self, request: Request) -> None:
        if self._model is None:
            raise EngineError(f"engine {self.instance.id}: no model loaded")
        if request.model != self._model:
            raise EngineError(
                f"engine {self.instance.id} serves {self._model!r}, "
                f"request {request.id} wants {request.model!r}"
            )
        if request.id in self._queues.seqs:
            raise EngineError(f"engine {self.instance.id}: request {request.id} already admitted")

    def _known(self, request_ids: Sequence[str]) -> list[Seq]:
        return [self._queues.seqs[i] for i in request_ids if i in self._queues.seqs]
