"""EngineModel: an iteration-level continuous-batching engine (vLLM-like), pure and clockless.

Time is passed in. The model holds one loaded model, a FCFS waiting queue, the running set
(sequences in prefill or decode, in admission order) and the sequences swapped to CPU. Every
iteration is scheduled as vLLM's default chunked-prefill scheduler does:

1. decodes first: every running sequence past its prompt decodes one token; when the KV cache
   has no room for those tokens, the most recently admitted running sequence is preempted
   (recompute: back to the front of the waiting queue, its KV dropped; swap: KV to CPU) until
   it has;
2. running sequences still in prefill get chunks from the iteration's token budget
   (`chunk_tokens`, which the decode tokens share);
3. if nothing was preempted, swapped sequences come back, then waiting ones are admitted in
   FCFS order (the head blocks the rest) while there are sequence slots, tokens in the budget
   and KV room for the whole prefill (KV is reserved at admission, as vLLM v0 does).

A request holds prompt + generated tokens of KV. The iteration that finishes a prefill emits
the request's next token (its first one, unless it is recomputing after a preemption). The
iteration's duration is `Profile.iteration_s` (step.py).

Speed: when an iteration only decodes, the batch cannot change until the next finish, the next
KV exhaustion or the next external operation, so the whole run of identical decode steps is one
segment, timed with the closed form of `DecodeRun`. Operations arriving mid-segment cut it:
the steps completed by then are applied, the step in flight completes, and the change is seen
by the iteration after it.

Operations (add, abort, swap_out, swap_in) change the queues at once; the iteration in flight
keeps its duration and its remaining members. `load` kills everything at once (Aborted events),
serves nothing for the profile's load_s, then emits ModelLoaded.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from qlm.engine.types import (
    Aborted,
    EngineError,
    EngineEvent,
    EngineObservation,
    EngineRequest,
    EngineState,
    FirstToken,
    ModelLoaded,
    RequestFinished,
)
from qlm.perf.profile import Profile
from qlm.perf.step import TIME_EPS_S, DecodeRun
from qlm.types import Fleet, Instance, Request

PreemptionMode = Literal["recompute", "swap"]


class EngineConfig(BaseModel):
    """Scheduler settings of one engine (vLLM's SchedulerConfig, reduced)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chunk_tokens: int = Field(
        default=2048,
        ge=1,
        description="Token budget per iteration (vLLM max_num_batched_tokens): one per "
        "decoding sequence plus prefill chunks; max_num_seqs is capped at it.",
    )
    preemption_mode: PreemptionMode = Field(
        default="recompute",
        description="What happens to a sequence preempted for KV room: 'recompute' drops its "
        "KV and requeues it; 'swap' moves its KV to CPU (recompute when CPU space is full).",
    )
    cpu_swap_tokens: int = Field(
        default=0,
        ge=0,
        description="KV tokens that fit in CPU swap space; 0 means no KV swapping "
        "(swap_out raises EngineError).",
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, description="Sequences running at once; None: the profile's."
    )
    swap_bytes_per_s: float = Field(
        default=16e9,
        gt=0,
        description="GPU<->CPU bandwidth for KV swaps; transfers lengthen the next iteration.",
    )

    @model_validator(mode="after")
    def _swap_needs_space(self) -> EngineConfig:
        if self.preemption_mode == "swap" and self.cpu_swap_tokens == 0:
            raise ValueError("preemption_mode 'swap' needs cpu_swap_tokens > 0")
        return self

    @property
    def supports_kv_swap(self) -> bool:
        return self.cpu_swap_tokens > 0


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters since the engine was built."""

    iterations: int
    prefill_tokens: int
    decode_tokens: int
    preemptions_recompute: int
    preemptions_swap: int
    swapped_tokens: int  # KV tokens moved between GPU and CPU, both ways
    busy_s: float  # time spent in completed iterations
    finished: int
    aborted: int
    segments: int  # runs of iterations the model computed in one go (<= iterations)

    @property
    def preemptions(self) -> int:
        return self.preemptions_recompute + self.preemptions_swap


class SeqPhase(StrEnum):
    WAITING = "waiting"  # in the engine's queue; holds no KV
    PREFILL = "prefill"  # admitted; KV reserved for its whole prefill; chunks in progress
    DECODE = "decode"  # produces one token per iteration
    SWAPPED = "swapped"  # KV on CPU (or paused while waiting); not scheduled
    DONE = "done"  # finished or aborted


@dataclass(slots=True, eq=False)
class _Seq:
    """One request inside the engine. While in DECODE its output count is implicit:
    output_tokens + (engine decode counter - g_join)."""

    request: Request
    target_tokens: int  # tokens it will generate before it stops
    order: int  # submission order in this engine (tie breaker)
    phase: SeqPhase = SeqPhase.WAITING
    version: int = 0  # bumped on every phase change; invalidates queue and heap entries
    output_tokens: int = 0
    g_join: int = 0
    prefill_target: int = 0  # tokens to (re)compute at admission: prompt + output so far
    computed_tokens: int = 0  # prefill progress
    cpu_tokens: int = 0  # KV on CPU while SWAPPED
    resume_phase: SeqPhase = SeqPhase.WAITING  # phase to return to from SWAPPED
    paused: bool = False  # swapped out by an operation; waits for swap_in
    first_token_at_s: float | None = None
    finish_reason: str = "length"  # "length": a cap ended it; "stop": its own length

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def prompt_tokens(self) -> int:
        return self.request.prompt_tokens


@dataclass(frozen=True, slots=True)
class _Segment:
    """Iterations in flight: `steps` decode steps timed by `run`, or (steps == 1) one
    iteration that also prefills `chunks` (seq, version at planning, tokens)."""

    start_s: float
    steps: int
    run: DecodeRun
    chunks: tuple[tuple[_Seq, int, int], ...] = ()
    preempted: bool = False  # its plan preempted (so it admitted nothing)
    swap_tokens: int = 0  # KV traffic charged to its first step

    @property
    def end_s(self) -> float:
        return self.start_s + self.run.duration_s(self.steps)

    def steps_done_by(self, at_s: float) -> int:
        return self.run.steps_done_by(at_s - self.start_s, self.steps)


@dataclass(slots=True)
class _Counters:
    iterations: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    preemptions_recompute: int = 0
    preemptions_swap: int = 0
    swapped_tokens: int = 0
    busy_s: float = 0.0
    finished: int = 0
    aborted: int = 0
    segments: int = 0


@dataclass(slots=True)
class _Plan:
    """What one scheduling pass decided (the budget object of a pass)."""

    tokens_left: int
    seqs_left: int
    preempted: bool = False
    chunks: list[tuple[_Seq, int, int]] = field(default_factory=list)


class EngineModel:
    """A continuous-batching engine on passed-in time. See the module docstring."""

    _waiting: deque[tuple[_Seq, int]]  # (seq, version when queued); stale entries skipped
    _running: dict[str, _Seq]  # PREFILL and DECODE, in admission order (victims: last)
    _prefilling: dict[str, _Seq]
    _swapped: dict[str, _Seq]
    _resumable: dict[str, _Seq]  # swapped and not paused: they come back on their own
    _finish_heap: list[tuple[int, int, int, _Seq]]  # (finish at decode step, order, version)
    _g: int  # decode steps the engine has taken; every decoding sequence advances with it
    _num_decode: int
    _decode_context_tokens: int  # prompt + output over the decoding sequences
    _prefill_reserved_tokens: int  # KV reserved for admitted prefills (+1 each)
    _cpu_used_tokens: int
    _pending_swap_tokens: int  # KV moved since the last iteration was planned
    _carry_preempted: bool  # a plan discarded at its start had preempted
    _segment: _Segment | None  # iterations in flight

    def __init__(
        self,
        instance: Instance,
        profiles: Fleet | Iterable[Profile],
        config: EngineConfig | None = None,
        start_s: float = 0.0,
    ) -> None:
        self.instance = instance
        self.config = config if config is not None else EngineConfig()
        self._profiles = _profiles_for(instance, profiles)
        self._now_s = start_s
        self._events: list[EngineEvent] = []
        self._counters = _Counters()
        self._seqs: dict[str, _Seq] = {}
        self._order = 0
        self._reset_queues()
        self._state = EngineState.EMPTY
        self._model: str | None = None
        self._profile: Profile | None = None
        self._load_done_at_s: float | None = None
        self._capacity_tokens = 0
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
        return self._capacity_tokens

    @property
    def max_num_seqs(self) -> int:
        return self._max_num_seqs

    @property
    def now_s(self) -> float:
        """The latest time the model has been advanced to."""
        return self._now_s

    @property
    def stats(self) -> EngineStats:
        c = self._counters
        return EngineStats(
            iterations=c.iterations,
            prefill_tokens=c.prefill_tokens,
            decode_tokens=c.decode_tokens,
            preemptions_recompute=c.preemptions_recompute,
            preemptions_swap=c.preemptions_swap,
            swapped_tokens=c.swapped_tokens,
            busy_s=c.busy_s,
            finished=c.finished,
            aborted=c.aborted,
            segments=c.segments,
        )

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
        advance_to)."""
        self._advance(now_s)
        done = self._decode_steps_in_flight(now_s)
        requests = tuple(self._view(seq, done) for seq in self._seqs.values())
        kv_used = self._kv_used_tokens() + done * self._num_decode
        return EngineObservation(
            instance_id=self.instance.id,
            state=self._state,
            model=self._model,
            requests=requests,
            kv_used_tokens=kv_used,
            kv_capacity_tokens=self._capacity_tokens,
            max_num_seqs=self._max_num_seqs,
            supports_kv_swap=self.config.supports_kv_swap,
            at_s=now_s,
        )

    # ------------------------------------------------------------------ time

    def advance_to(self, t_s: float) -> list[EngineEvent]:
        """Run the engine up to t_s; return the events since the last call, in time order."""
        self._advance(t_s)
        events, self._events = self._events, []
        return events

    # ------------------------------------------------------------------ operations

    def add(self, request: Request, now_s: float, output_tokens: int | None = None) -> None:
        """Admit a request into the engine's waiting queue. It generates output_tokens tokens
        (default: request.max_output_tokens), capped by max_output_tokens and by the KV
        capacity (a sequence never outgrows the cache, like vLLM's max_model_len)."""
        self._advance(now_s)
        self._check_can_add(request)
        if request.prompt_tokens + 1 > self._capacity_tokens:
            self._counters.aborted += 1
            self._events.append(Aborted(request.id, now_s, "prompt exceeds the KV capacity"))
            return
        cap = min(request.max_output_tokens, self._capacity_tokens - request.prompt_tokens)
        stops = output_tokens is not None and output_tokens < cap
        target = max(1, output_tokens) if stops and output_tokens is not None else cap
        seq = _Seq(request, target, self._order, finish_reason="stop" if stops else "length")
        self._order += 1
        self._seqs[request.id] = seq
        plan_s = self._interrupt(now_s)
        self._enqueue(seq, front=False)
        self._resume(plan_s)

    def abort(self, request_ids: Sequence[str], now_s: float, reason: str = "aborted") -> None:
        """Drop requests at once (Aborted events at now_s) and free their KV. Unknown or
        already ended ids are ignored."""
        self._advance(now_s)
        seqs = [self._seqs[i] for i in request_ids if i in self._seqs]
        if not seqs:
            return
        plan_s = self._interrupt(now_s)
        for seq in seqs:
            self._drop(seq)
            self._counters.aborted += 1
            self._events.append(Aborted(seq.id, now_s, reason))
        self._resume(plan_s)

    def swap_out(self, request_ids: Sequence[str], now_s: float) -> None:
        """Move requests' KV to CPU; they pause until swap_in. A waiting request pauses with
        no KV. EngineError without swap support or when the CPU space is short."""
        self._advance(now_s)
        if not self.config.supports_kv_swap:
            raise EngineError(f"engine {self.instance.id}: KV swapping is off")
        seqs = [self._seqs[i] for i in request_ids if i in self._seqs]
        plan_s = self._interrupt(now_s)
        need = sum(self._gpu_tokens(s) for s in seqs if s.phase is not SeqPhase.SWAPPED)
        if need > self.config.cpu_swap_tokens - self._cpu_used_tokens:
            self._resume(plan_s)
            raise EngineError(
                f"engine {self.instance.id}: {need} KV tokens do not fit the CPU swap space "
                f"({self.config.cpu_swap_tokens - self._cpu_used_tokens} free)"
            )
        for seq in seqs:
            if seq.phase is SeqPhase.SWAPPED:
                self._resumable.pop(seq.id, None)
            else:
                self._swap_to_cpu(seq)
            seq.paused = True
        self._resume(plan_s)

    def swap_in(self, request_ids: Sequence[str], now_s: float) -> None:
        """Let swapped requests resume: their KV returns when there is room (before any
        waiting request is admitted). Requests that are not swapped are ignored."""
        self._advance(now_s)
        seqs = [self._seqs[i] for i in request_ids if i in self._seqs]
        plan_s = self._interrupt(now_s)
        for seq in seqs:
            if seq.phase is not SeqPhase.SWAPPED or not seq.paused:
                continue
            seq.paused = False
            if seq.resume_phase is SeqPhase.WAITING:
                del self._swapped[seq.id]
                self._enqueue(seq, front=True)
            else:
                self._resumable[seq.id] = seq
        self._resume(plan_s)

    def load(self, model: str, now_s: float) -> None:
        """Switch models: abort every request at once, serve nothing for the profile's
        load_s, then emit ModelLoaded. EngineError for a model this instance cannot serve."""
        self._advance(now_s)
        if model not in self._profiles:
            raise EngineError(
                f"engine {self.instance.id} cannot load {model!r}; "
                f"it has profiles that fit for: {', '.join(self.models()) or 'none'}"
            )
        for seq in list(self._seqs.values()):
            self._drop(seq)
            self._counters.aborted += 1
            self._events.append(Aborted(seq.id, now_s, f"model load ({model})"))
        self._reset_queues()
        self._install(model)
        self._state = EngineState.LOADING
        assert self._profile is not None
        self._load_done_at_s = now_s + self._profile.load_s
        self._advance(now_s)  # a zero load time completes at once

    # ------------------------------------------------------------------ internals: time

    def _advance(self, t_s: float) -> None:
        if t_s < self._now_s - TIME_EPS_S:
            raise ValueError(f"engine {self.instance.id}: time went back ({t_s} < {self._now_s})")
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
            self._complete(seg, seg.steps)
            self._now_s = max(self._now_s, seg.end_s)
            self._schedule(seg.end_s)
        self._now_s = max(self._now_s, t_s)

    def _finish_load(self, at_s: float) -> None:
        assert self._model is not None
        assert self._profile is not None
        self._state = EngineState.READY
        self._load_done_at_s = None
        self._events.append(ModelLoaded(self._model, at_s, self._profile.load_s))
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
            self._complete(seg, done)
        boundary_s = seg.start_s + seg.run.duration_s(done)
        if now_s <= boundary_s + TIME_EPS_S:
            self._segment = None
            return boundary_s
        step = DecodeRun(seg.run.step_s(done))
        self._segment = _Segment(boundary_s, 1, step)
        return now_s

    def _discard(self, seg: _Segment) -> None:
        """Drop a plan made at this very instant; the next plan inherits what it did to the
        queues (admissions, preemptions, swaps), so it also inherits its flags."""
        self._segment = None
        self._carry_preempted = seg.preempted
        self._pending_swap_tokens += seg.swap_tokens

    def _resume(self, plan_s: float) -> None:
        """After an operation: drop an iteration in flight that has no members left, and
        start iterating if the engine is idle."""
        seg = self._segment
        emptied = seg is not None and self._num_decode == 0
        if emptied and seg is not None and all(s.version != v for s, v, _ in seg.chunks):
            self._segment = None
        if self._segment is None and self._state is EngineState.READY:
            self._schedule(plan_s)

    def _decode_steps_in_flight(self, now_s: float) -> int:
        seg = self._segment
        if seg is None or seg.chunks:
            return 0
        return seg.steps_done_by(now_s)

    # ------------------------------------------------------------------ internals: iterations

    def _complete(self, seg: _Segment, steps: int) -> None:
        """Apply `steps` completed iterations of a segment; emit finishes and first tokens."""
        at_s = seg.start_s + seg.run.duration_s(steps)
        c = self._counters
        c.segments += 1
        c.iterations += steps
        c.busy_s += seg.run.duration_s(steps)
        c.decode_tokens += self._num_decode * steps
        self._g += steps
        self._decode_context_tokens += self._num_decode * steps
        self._finish_decodes(at_s)
        for seq, version, tokens in seg.chunks:
            if seq.version != version:
                continue  # aborted, preempted or swapped while the iteration ran
            seq.computed_tokens += tokens
            c.prefill_tokens += tokens
            if seq.computed_tokens >= seq.prefill_target:
                self._complete_prefill(seq, at_s)

    def _finish_decodes(self, at_s: float) -> None:
        heap = self._finish_heap
        while heap and heap[0][0] <= self._g:
            _, _, version, seq = heapq.heappop(heap)
            if seq.version == version and seq.phase is SeqPhase.DECODE:
                self._leave_decode(seq)
                self._finish(seq, at_s)

    def _complete_prefill(self, seq: _Seq, at_s: float) -> None:
        """The iteration that computes a prompt's last chunk samples its next token."""
        del self._prefilling[seq.id]
        self._prefill_reserved_tokens -= seq.prefill_target + 1
        seq.output_tokens += 1
        if seq.first_token_at_s is None:
            seq.first_token_at_s = at_s
            self._events.append(FirstToken(seq.id, at_s))
        if seq.output_tokens >= seq.target_tokens:
            self._finish(seq, at_s)
            return
        self._join_decode(seq)

    def _finish(self, seq: _Seq, at_s: float) -> None:
        self._running.pop(seq.id, None)
        self._retire(seq)
        self._counters.finished += 1
        assert seq.first_token_at_s is not None
        self._events.append(
            RequestFinished(
                seq.id, at_s, seq.first_token_at_s, seq.output_tokens, seq.finish_reason
            )
        )

    def _schedule(self, at_s: float) -> None:
        """Plan the next iteration(s) at at_s, or go idle."""
        self._segment = None
        if self._state is not EngineState.READY:
            return
        plan = _Plan(
            tokens_left=self.config.chunk_tokens,
            seqs_left=self._max_num_seqs - len(self._running),
        )
        plan.preempted = self._make_decode_room() or self._carry_preempted
        self._carry_preempted = False
        plan.tokens_left -= self._num_decode
        self._plan_running_prefills(plan)
        if not plan.preempted:
            self._plan_swap_ins(plan)
            self._plan_admissions(plan)
        self._segment = self._segment_for(plan, at_s)

    def _segment_for(self, plan: _Plan, at_s: float) -> _Segment | None:
        profile = self._profile
        assert profile is not None
        n = self._num_decode
        swapped = self._pending_swap_tokens
        self._pending_swap_tokens = 0
        swap_s = swapped * profile.kv_bytes_per_token / self.config.swap_bytes_per_s
        if plan.chunks:
            prefill = sum(tokens for _, _, tokens in plan.chunks)
            context = self._decode_context_tokens + sum(
                seq.computed_tokens + tokens for seq, _, tokens in plan.chunks
            )
            step = DecodeRun(profile.iteration_s(prefill, n, context) + swap_s)
            return _Segment(at_s, 1, step, tuple(plan.chunks), plan.preempted, swapped)
        if n == 0:
            return None
        run = profile.decode_run(n, self._decode_context_tokens)
        if swap_s > 0 or plan.preempted:
            step = DecodeRun(run.first_step_s + swap_s)
            return _Segment(at_s, 1, step, (), plan.preempted, swapped)
        return _Segment(at_s, self._decode_run_steps(), run)

    def _decode_run_steps(self) -> int:
        """Decode steps until the first finish or until the KV cache is full."""
        heap = self._finish_heap
        while heap and (
            heap[0][3].version != heap[0][2] or heap[0][3].phase is not SeqPhase.DECODE
        ):
            heapq.heappop(heap)
        until_finish = heap[0][0] - self._g
        until_full = (self._capacity_tokens - self._kv_used_tokens()) // self._num_decode
        return max(1, min(until_finish, until_full))

    def _make_decode_room(self) -> bool:
        """Preempt the latest admitted running sequences until every decode has a KV slot."""
        preempted = False
        while self._num_decode > self._capacity_tokens - self._kv_used_tokens():
            victim = self._running[next(reversed(self._running))]
            self._preempt(victim)
            preempted = True
        return preempted

    def _plan_running_prefills(self, plan: _Plan) -> None:
        for seq in self._prefilling.values():
            if plan.tokens_left <= 0:
                return
            tokens = min(seq.prefill_target - seq.computed_tokens, plan.tokens_left)
            plan.chunks.append((seq, seq.version, tokens))
            plan.tokens_left -= tokens

    def _plan_swap_ins(self, plan: _Plan) -> None:
        for seq in list(self._resumable.values()):
            if plan.seqs_left <= 0 or plan.tokens_left <= 0:
                return
            if seq.resume_phase is SeqPhase.DECODE:
                need = seq.cpu_tokens + 1
            else:
                need = seq.prefill_target + 1
            if need > self._room_after_decodes():
                return
            self._swap_to_gpu(seq)
            plan.seqs_left -= 1
            if seq.phase is SeqPhase.DECODE:
                plan.tokens_left -= 1
            else:
                tokens = min(seq.prefill_target - seq.computed_tokens, plan.tokens_left)
                plan.chunks.append((seq, seq.version, tokens))
                plan.tokens_left -= tokens

    def _plan_admissions(self, plan: _Plan) -> None:
        waiting = self._waiting
        while waiting and plan.seqs_left > 0 and plan.tokens_left > 0:
            seq, version = waiting[0]
            if seq.version != version or seq.phase is not SeqPhase.WAITING:
                waiting.popleft()
                continue
            need = seq.prompt_tokens + seq.output_tokens + 1
            if need > self._room_after_decodes():
                return
            waiting.popleft()
            self._admit(seq)
            plan.seqs_left -= 1
            tokens = min(seq.prefill_target, plan.tokens_left)
            plan.chunks.append((seq, seq.version, tokens))
            plan.tokens_left -= tokens

    # ------------------------------------------------------------------ internals: moves

    def _admit(self, seq: _Seq) -> None:
        self._set_phase(seq, SeqPhase.PREFILL)
        seq.prefill_target = seq.prompt_tokens + seq.output_tokens
        seq.computed_tokens = 0
        self._prefill_reserved_tokens += seq.prefill_target + 1
        self._running[seq.id] = seq
        self._prefilling[seq.id] = seq

    def _join_decode(self, seq: _Seq) -> None:
        self._set_phase(seq, SeqPhase.DECODE)
        seq.g_join = self._g
        self._num_decode += 1
        self._decode_context_tokens += seq.prompt_tokens + seq.output_tokens
        finish_g = self._g + seq.target_tokens - seq.output_tokens
        heapq.heappush(self._finish_heap, (finish_g, seq.order, seq.version, seq))

    def _leave_decode(self, seq: _Seq) -> None:
        """Make a decoding sequence's output explicit and take it out of the decode batch."""
        seq.output_tokens += self._g - seq.g_join
        self._num_decode -= 1
        self._decode_context_tokens -= seq.prompt_tokens + seq.output_tokens

    def _preempt(self, seq: _Seq) -> None:
        cpu_free = self.config.cpu_swap_tokens - self._cpu_used_tokens
        if self.config.preemption_mode == "swap" and self._gpu_tokens(seq) <= cpu_free:
            self._counters.preemptions_swap += 1
            self._swap_to_cpu(seq)
            self._resumable[seq.id] = seq
            return
        self._counters.preemptions_recompute += 1
        self._release_gpu(seq)
        seq.computed_tokens = 0
        self._enqueue(seq, front=True)

    def _swap_to_cpu(self, seq: _Seq) -> None:
        """Move a sequence out of the GPU: its KV (if any) goes to CPU; it stops running."""
        if seq.phase is SeqPhase.WAITING:
            seq.resume_phase = SeqPhase.WAITING
            seq.cpu_tokens = 0
        else:
            seq.resume_phase = seq.phase
            seq.cpu_tokens = self._release_gpu(seq)
        self._cpu_used_tokens += seq.cpu_tokens
        self._pending_swap_tokens += seq.cpu_tokens
        self._counters.swapped_tokens += seq.cpu_tokens
        self._set_phase(seq, SeqPhase.SWAPPED)
        self._swapped[seq.id] = seq

    def _swap_to_gpu(self, seq: _Seq) -> None:
        del self._swapped[seq.id]
        self._resumable.pop(seq.id, None)
        self._cpu_used_tokens -= seq.cpu_tokens
        self._pending_swap_tokens += seq.cpu_tokens
        self._counters.swapped_tokens += seq.cpu_tokens
        seq.cpu_tokens = 0
        self._running[seq.id] = seq
        if seq.resume_phase is SeqPhase.DECODE:
            self._join_decode(seq)
        else:
            self._set_phase(seq, SeqPhase.PREFILL)
            self._prefill_reserved_tokens += seq.prefill_target + 1
            self._prefilling[seq.id] = seq

    def _release_gpu(self, seq: _Seq) -> int:
        """Take a running sequence off the GPU; returns the KV tokens it had computed."""
        self._running.pop(seq.id, None)
        if seq.phase is SeqPhase.DECODE:
            self._leave_decode(seq)
            held = seq.prompt_tokens + seq.output_tokens
        else:
            del self._prefilling[seq.id]
            self._prefill_reserved_tokens -= seq.prefill_target + 1
            held = seq.computed_tokens
        self._set_phase(seq, SeqPhase.WAITING)
        return held

    def _drop(self, seq: _Seq) -> None:
        """Remove a live sequence from wherever it is (abort)."""
        if seq.phase in (SeqPhase.DECODE, SeqPhase.PREFILL):
            self._release_gpu(seq)
        elif seq.phase is SeqPhase.SWAPPED:
            self._cpu_used_tokens -= seq.cpu_tokens
            del self._swapped[seq.id]
            self._resumable.pop(seq.id, None)
        self._retire(seq)

    def _retire(self, seq: _Seq) -> None:
        self._set_phase(seq, SeqPhase.DONE)
        del self._seqs[seq.id]

    def _enqueue(self, seq: _Seq, front: bool) -> None:
        self._set_phase(seq, SeqPhase.WAITING)
        entry = (seq, seq.version)
        if front:
            self._waiting.appendleft(entry)
        else:
            self._waiting.append(entry)

    @staticmethod
    def _set_phase(seq: _Seq, phase: SeqPhase) -> None:
        seq.phase = phase
        seq.version += 1

    # ------------------------------------------------------------------ internals: state

    def _install(self, model: str) -> None:
        profile = self._profiles[model]
        self._model = model
        self._profile = profile
        self._capacity_tokens = profile.kv_capacity_tokens(self.instance.gpu_memory_bytes)
        # Every running sequence must fit one iteration's token budget.
        wanted = self.config.max_num_seqs or profile.max_batch_size
        self._max_num_seqs = min(wanted, self.config.chunk_tokens)

    def _reset_queues(self) -> None:
        self._waiting = deque()
        self._running = {}
        self._prefilling = {}
        self._swapped = {}
        self._resumable = {}
        self._finish_heap = []
        self._g = 0
        self._num_decode = 0
        self._decode_context_tokens = 0
        self._prefill_reserved_tokens = 0
        self._cpu_used_tokens = 0
        self._pending_swap_tokens = 0
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
        if request.id in self._seqs:
            raise EngineError(f"engine {self.instance.id}: request {request.id} already admitted")

    def _kv_used_tokens(self) -> int:
        return self._decode_context_tokens + self._prefill_reserved_tokens

    def _room_after_decodes(self) -> int:
        """KV tokens free once this iteration's decodes have their slots."""
        return self._capacity_tokens - self._kv_used_tokens() - self._num_decode

    def _gpu_tokens(self, seq: _Seq) -> int:
        """KV tokens a sequence has computed on the GPU (what a swap moves)."""
        if seq.phase is SeqPhase.DECODE:
            return seq.prompt_tokens + seq.output_tokens + self._g - seq.g_join
        if seq.phase is SeqPhase.PREFILL:
            return seq.computed_tokens
        return 0

    def _view(self, seq: _Seq, decode_steps_in_flight: int) -> EngineRequest:
        output = seq.output_tokens
        if seq.phase is SeqPhase.DECODE:
            output += self._g - seq.g_join + decode_steps_in_flight
        return EngineRequest(
            request_id=seq.id,
            slo_class=seq.request.slo_class,
            prompt_tokens=seq.prompt_tokens,
            max_output_tokens=seq.request.max_output_tokens,
            output_tokens=output,
            started=seq.first_token_at_s is not None,
            kv_on_cpu=seq.phase is SeqPhase.SWAPPED,
        )


def _profiles_for(instance: Instance, profiles: Fleet | Iterable[Profile]) -> dict[str, Profile]:
    """The profiles of the instance's GPU type that fit it, by model."""
    found: dict[str, Profile] = {}
    given = profiles.profiles.values() if isinstance(profiles, Fleet) else profiles
    for profile in given:
        if profile.gpu_type != instance.gpu_type:
            continue
        if profile.model in found:
            raise ValueError(f"two profiles for ({profile.model}, {profile.gpu_type})")
        fits = instance.gpu_count >= profile.gpu_count and profile.fits(instance.gpu_memory_bytes)
        if fits:
            found[profile.model] = profile
    if instance.loaded_model is not None and instance.loaded_model not in found:
        raise ValueError(
            f"instance {instance.id}: no profile that fits for its loaded model "
            f"{instance.loaded_model!r} on {instance.gpu_type}"
        )
    return found


__all__ = [
    "EngineConfig",
    "EngineModel",
    "EngineStats",
    "PreemptionMode",
    "SeqPhase",
]
