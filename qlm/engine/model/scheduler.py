"""The iteration-level scheduler of the engine model (vLLM's default chunked-prefill policy).

Question answered: what runs in the next iteration, and what does a completed one change?

`schedule` plans one iteration within a token budget (`chunk_tokens`, vLLM's
max_num_batched_tokens) and the free sequence slots (`max_num_seqs`):

1. decodes first: every running sequence past its prompt decodes one token; while the KV cache
   has no room for those tokens, cached prefix blocks no sequence references are evicted
   (least recently used first), then the most recently admitted running sequence is preempted
   (recompute: back to the front of the waiting queue, its KV dropped; swap: KV to CPU);
2. running sequences still in prefill get chunks from what is left of the budget;
3. if nothing was preempted, swapped sequences come back, then waiting ones are admitted in
   FCFS order (the head blocks the rest) while there are slots, budget and KV room for the
   whole prefill after this iteration's decodes (KV is reserved at admission, as vLLM v0 does).
   A sequence whose leading prefix blocks are cached (qlm/prefixes/cache.py) needs KV for, and
   computes, only the rest; unreferenced cached blocks are evicted to make room. With
   `waiting_order: prefix-groups` the order is Preble's priority groups instead
   (`prefix_order`; requests waiting `max_wait_iterations` or more first).

With `waiting_order: srpt-mlfq` (Prophet; the native engine's local policy of the same name)
steps 2 and 3 become one pass after the swap-ins: running prefills and the first
`SRPT_CANDIDATES` waiting sequences, those waiting `max_wait_iterations` or more since they
arrived first (oldest first), then the rest by the prompt tokens they have left to compute
(cached prefix blocks excepted), shortest first; the first waiting one that does not fit stops
admissions (running prefills still get their chunks). The preemption victim of step 1 is the
running sequence at the highest feedback level, floor(log2(1 + output / quantum)), the latest
admitted among those (`mlfq_victim`).

`complete` applies completed iterations: decode steps add a token to every decoding sequence
and end those that reach their length (RequestFinished); prefill chunks advance their
sequences, and the iteration that computes a prompt's last chunk samples its next token (its
first one, FirstToken, unless it is recomputing after a preemption). Chunks whose sequence
changed phase while the iteration ran (aborted, preempted, swapped) count for nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from qlm.engine.engine_types import EngineEvent, FirstToken, HandedOff, RequestFinished
from qlm.engine.model.segment import Chunk, Segment
from qlm.engine.model.seq_queues import SeqQueues
from qlm.engine.model.sequence import Seq, SeqPhase
from qlm.prefixes.local_order import by_priority_groups

SRPT_CANDIDATES = 256  # waiting sequences srpt-mlfq orders per iteration (bounds the cost)


@dataclass(slots=True)
class IterationPlan:
    """One scheduling pass: its budgets as it goes, and what it decided."""

    tokens_left: int
    seqs_left: int
    preempted: bool = False
    chunks: list[Chunk] = field(default_factory=list)

    def add_chunk(self, seq: Seq, tokens: int) -> None:
        self.chunks.append(Chunk(seq, seq.version, tokens))
        self.tokens_left -= tokens


def schedule(
    queues: SeqQueues, chunk_tokens: int, max_num_seqs: int, preempted_before: bool = False
) -> IterationPlan:
    """Plan the next iteration (module docstring). `preempted_before`: a plan dropped at this
    very instant had preempted, so this one admits nothing either."""
    plan = IterationPlan(tokens_left=chunk_tokens, seqs_left=max_num_seqs - len(queues.running))
    plan.preempted = _make_decode_room(queues) or preempted_before
    plan.tokens_left -= queues.decode.num_seqs
    if queues.config.waiting_order == "srpt-mlfq":
        if not plan.preempted:
            _plan_swap_ins(queues, plan)
        _plan_srpt(queues, plan, admit=not plan.preempted)
        return plan
    _plan_running_prefills(queues, plan)
    if not plan.preempted:
        _plan_swap_ins(queues, plan)
        _plan_admissions(queues, plan)
    return plan


def _make_decode_room(queues: SeqQueues) -> bool:
    """Preempt the latest admitted running sequences until every decode has a KV slot."""
    preempted = False
    kv = queues.kv
    if kv.decode_slots_short and queues.prefix.idle_tokens:
        queues.prefix.evict(kv.decode.num_seqs - kv.free_tokens)
    srpt = queues.config.waiting_order == "srpt-mlfq"
    while kv.decode_slots_short:
        victim = mlfq_victim(queues) if srpt else queues.running[next(reversed(queues.running))]
        queues.preempt(victim)
        preempted = True
    return preempted


def _plan_running_prefills(queues: SeqQueues, plan: IterationPlan) -> None:
    for seq in queues.prefilling.values():
        if plan.tokens_left <= 0:
            return
        plan.add_chunk(seq, min(seq.prefill_target - seq.computed_tokens, plan.tokens_left))


def _plan_swap_ins(queues: SeqQueues, plan: IterationPlan) -> None:
    for seq in list(queues.resumable.values()):
        if plan.seqs_left <= 0 or plan.tokens_left <= 0:
            return
        if seq.resume_phase is SeqPhase.DECODE:
            kv_tokens = seq.cpu_tokens
        else:
            kv_tokens = seq.prefill_target - seq.shared_tokens
        if not queues.make_room(kv_tokens + 1):
            return
        queues.swap_to_gpu(seq)
        plan.seqs_left -= 1
        if seq.phase is SeqPhase.DECODE:
            plan.tokens_left -= 1
        else:
            plan.add_chunk(seq, min(seq.prefill_target - seq.computed_tokens, plan.tokens_left))


def _plan_admissions(queues: SeqQueues, plan: IterationPlan) -> None:
    if queues.config.waiting_order == "prefix-groups":
        _plan_grouped_admissions(queues, plan)
        return
    waiting = queues.waiting
    while waiting and plan.seqs_left > 0 and plan.tokens_left > 0:
        seq, version = waiting[0]
        if seq.version != version or seq.phase is not SeqPhase.WAITING:
            waiting.popleft()
            continue
        blocks, hit_tokens = queues.cached_blocks(seq)
        if not queues.fits(seq, blocks, hit_tokens):
            return
        waiting.popleft()
        queues.admit(seq, blocks)
        plan.seqs_left -= 1
        plan.add_chunk(seq, min(seq.prefill_target - seq.computed_tokens, plan.tokens_left))


def _plan_grouped_admissions(queues: SeqQueues, plan: IterationPlan) -> None:
    """Admit in `prefix_order` over the first waiting sequences (four per free slot: the
    candidates of this iteration), the first that does not fit blocking the rest."""
    candidates = _waiting_candidates(queues, 4 * plan.seqs_left)
    for seq in prefix_order(queues, candidates):
        if plan.seqs_left <= 0 or plan.tokens_left <= 0:
            return
        blocks, hit_tokens = queues.cached_blocks(seq)
        if not queues.fits(seq, blocks, hit_tokens):
            return
        queues.admit(seq, blocks)  # its queue entry goes stale and is skipped later
        plan.seqs_left -= 1
        plan.add_chunk(seq, min(seq.prefill_target - seq.computed_tokens, plan.tokens_left))


def _plan_srpt(queues: SeqQueues, plan: IterationPlan, admit: bool) -> None:
    admitting = admit
    for seq in srpt_order(queues, _waiting_candidates(queues, SRPT_CANDIDATES) if admit else []):
        if plan.tokens_left <= 0:
            return
        if seq.phase is SeqPhase.PREFILL:
            plan.add_chunk(seq, min(seq.prefill_target - seq.computed_tokens, plan.tokens_left))
            continue
        if not admitting or plan.seqs_left <= 0:
            admitting = False
            continue
        blocks, hit_tokens = queues.cached_blocks(seq)
        if not queues.fits(seq, blocks, hit_tokens):
            admitting = False  # later ones do not pass one that does not fit
            continue
        queues.admit(seq, blocks)
        plan.seqs_left -= 1
        plan.add_chunk(seq, min(seq.prefill_target - seq.computed_tokens, plan.tokens_left))


def _waiting_candidates(queues: SeqQueues, limit: int) -> list[Seq]:
    """The first `limit` live entries of the waiting queue (stale ones at its head dropped:
    admitted or moved since they were queued)."""
    waiting = queues.waiting
    while waiting and (
        waiting[0][0].version != waiting[0][1] or waiting[0][0].phase is not SeqPhase.WAITING
    ):
        waiting.popleft()
    candidates: list[Seq] = []
    for seq, version in waiting:
        if len(candidates) >= limit:
            break
        if seq.version == version and seq.phase is SeqPhase.WAITING:
            candidates.append(seq)
    return candidates


def srpt_order(queues: SeqQueues, waiting: list[Seq]) -> list[Seq]:
    """Running prefills and `waiting` in srpt-mlfq's order (module docstring)."""
    config, now = queues.config, queues.counters.iterations

    def left(seq: Seq) -> int:
        if seq.phase is SeqPhase.PREFILL:
            return seq.prefill_target - seq.computed_tokens
        return seq.prompt_tokens + seq.output_tokens - queues.cached_blocks(seq)[1]

    seqs = [*queues.prefilling.values(), *waiting]
    starving = [s for s in seqs if now - s.queued_iteration >= config.max_wait_iterations]
    rest = [s for s in seqs if now - s.queued_iteration < config.max_wait_iterations]
    starving.sort(key=lambda s: (s.queued_iteration, s.order))
    rest.sort(key=lambda s: (left(s), s.queued_iteration, s.order))
    return starving + rest


def mlfq_victim(queues: SeqQueues) -> Seq:
    """The running sequence at the highest feedback level, the latest admitted among those."""
    quantum = queues.config.mlfq_quantum_tokens

    def level(seq: Seq) -> int:
        return int(math.log2(1 + queues.decode.output_tokens(seq) / quantum))

    running = list(queues.running.values())
    top = max(level(s) for s in running)
    return [s for s in running if level(s) == top][-1]


def prefix_order(queues: SeqQueues, seqs: list[Seq]) -> list[Seq]:
    """Preble's local order (`by_priority_groups`), the hit share of a sequence being the part
    of its prompt the prefix cache holds now; those waiting `max_wait_iterations` or more
    first, oldest first (rounds restart every iteration: without the bound, a stream of hits
    would keep the top group first for as long as it lasts)."""
    now, bound = queues.counters.iterations, queues.config.max_wait_iterations
    starving = [s for s in seqs if now - s.queued_iteration >= bound]
    rest = [s for s in seqs if now - s.queued_iteration < bound]
    starving.sort(key=lambda s: (s.queued_iteration, s.order))
    ranked = by_priority_groups(
        rest,
        lambda seq: (queues.cached_blocks(seq)[1], seq.prompt_tokens),
        queues.config.prefix_groups,
    )
    return starving + ranked


def complete(queues: SeqQueues, segment: Segment, steps: int, events: list[EngineEvent]) -> None:
    """Apply `steps` completed iterations of a segment; append the finishes and first tokens
    to `events`."""
    at_s = segment.start_s + segment.run.duration_s(steps)
    decode = queues.decode
    c = queues.counters
    c.segments += 1
    c.iterations += steps
    c.busy_s += segment.run.duration_s(steps)
    c.decode_tokens += decode.num_seqs * steps
    decode.advance(steps)
    for seq in decode.finished():
        decode.leave(seq)
        events.append(_finish(queues, seq, at_s))
    for seq, version, tokens in segment.chunks:
        if seq.version != version:
            continue  # aborted, preempted or swapped while the iteration ran
        seq.computed_tokens += tokens
        c.prefill_tokens += tokens
        if seq.computed_tokens >= seq.prefill_target:
            _complete_prefill(queues, seq, at_s, events)


def _complete_prefill(queues: SeqQueues, seq: Seq, at_s: float, events: list[EngineEvent]) -> None:
    """The iteration that computes a prompt's last chunk samples its next token."""
    queues.end_prefill(seq)
    queues.cache_prompt(seq)
    seq.output_tokens += 1
    if seq.first_token_at_s is None:
        seq.first_token_at_s = at_s
        events.append(FirstToken(seq.id, at_s))
    if seq.output_tokens >= seq.target_tokens:
        events.append(_finish(queues, seq, at_s))
    elif queues.hands_off:
        events.append(_hand_off(queues, seq, at_s))
    else:
        queues.decode.join(seq)


def _hand_off(queues: SeqQueues, seq: Seq, at_s: float) -> HandedOff:
    """A prefill engine's prompt is done: its KV leaves (freed here at once: the transfer is
    the simulator's, qlm/sim/handoff.py) and a decode engine goes on from this token."""
    queues.running.pop(seq.id, None)
    queues.release_prefix(seq)
    queues.retire(seq)
    queues.counters.handed_off += 1
    assert seq.first_token_at_s is not None
    kv_tokens = seq.prompt_tokens + seq.output_tokens
    return HandedOff(seq.id, at_s, seq.first_token_at_s, kv_tokens)


def _finish(queues: SeqQueues, seq: Seq, at_s: float) -> RequestFinished:
    queues.finish(seq)
    assert seq.first_token_at_s is not None
    return RequestFinished(seq.id, at_s, seq.first_token_at_s, seq.output_tokens, seq.finish_reason)
