"""Where each sequence of the engine model is, and the moves between places.

Question answered: which sequences wait, run (prefill or decode) or sit swapped out, and what
does moving one do to the decode batch and the KV cache? `SeqQueues` holds the live sequences by
id, the FCFS waiting queue, the running set in admission order (preemption victims are taken
from its end), the prefilling subset, the swapped sequences and the resumable subset of those
(swapped by preemption, not paused by swap_out: they come back on their own). Each move keeps
the queues, the decode batch (decode_batch.py), the KV accounting (kv_cache.py) and the
counters consistent; which move to make, and when, is the scheduler's (scheduler.py) or the
caller's. A sequence references its cached prefix blocks (qlm/prefixes/cache.py) from
admission until it finishes, is aborted or is preempted to recompute; swapped out, it keeps
them on the GPU and moves only its own KV.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from qlm.config.engine_config import EngineConfig
from qlm.engine.engine_types import EngineRequest
from qlm.engine.model.decode_batch import DecodeBatch
from qlm.engine.model.kv_cache import KvCache
from qlm.engine.model.sequence import Seq, SeqPhase
from qlm.engine.model.stats import EngineCounters
from qlm.prefixes.cache import PrefixCache


class SeqQueues:
    """The sequences of one loaded model (a model load starts a fresh one)."""

    def __init__(self, config: EngineConfig, counters: EngineCounters) -> None:
        self.config = config
        self.counters = counters
        self.seqs: dict[str, Seq] = {}  # every live sequence, in submission order
        self.waiting: deque[tuple[Seq, int]] = deque()  # (seq, version when queued)
        self.running: dict[str, Seq] = {}  # PREFILL and DECODE, in admission order
        self.prefilling: dict[str, Seq] = {}
        self.swapped: dict[str, Seq] = {}
        self.resumable: dict[str, Seq] = {}  # swapped and not paused
        self.decode = DecodeBatch()
        self.prefix = PrefixCache(counters.prefix)
        self.kv = KvCache(self.decode, self.prefix, cpu_capacity_tokens=config.cpu_swap_tokens)
        self.hands_off = False  # a prefill engine's: prompts leave after their first token

    def views(self, decode_steps_in_flight: int) -> tuple[EngineRequest, ...]:
        """Every live sequence as the engine's observation lists it (its output counts the
        decode steps in flight; DecodeBatch.output_tokens, inlined: this runs per sequence
        at every observation)."""
        step = self.decode.step + decode_steps_in_flight
        decode, swapped = SeqPhase.DECODE, SeqPhase.SWAPPED
        views = []
        for seq in self.seqs.values():
            request, phase, output = seq.request, seq.phase, seq.output_tokens
            if phase is decode:
                output += step - seq.joined_at_step
            started = seq.first_token_at_s is not None
            views.append(
                EngineRequest(
                    request.id,
                    request.slo_class,
                    request.prompt_tokens,
                    request.max_output_tokens,
                    output,
                    started,
                    phase is swapped,
                )
            )
        return tuple(views)

    def enqueue(self, seq: Seq, front: bool) -> None:
        seq.set_phase(SeqPhase.WAITING)
        entry = (seq, seq.version)
        if front:
            self.waiting.appendleft(entry)
        else:
            self.waiting.append(entry)

    def cached_blocks(self, seq: Seq) -> tuple[int, int]:
        """(its leading prefix blocks the cache holds, their tokens)."""
        prefix = seq.request.prefix
        if not prefix:
            return 0, 0
        blocks = self.prefix.match(prefix)
        return blocks, sum(block.tokens for block in prefix[:blocks])

    def fits(self, seq: Seq, blocks: int, hit_tokens: int) -> bool:
        """Whether admitting it with `blocks` cached leaves KV for its whole prefill after
        this iteration's decodes, counting cached blocks no one references as room."""
        need = seq.prompt_tokens + seq.output_tokens + 1 - hit_tokens
        room = self.kv.room_after_decodes
        if need <= room:
            return True
        prefix = self.prefix
        evictable = prefix.idle_tokens - prefix.idle_within(seq.request.prefix, blocks)
        return need <= room + evictable

    def admit(self, seq: Seq, blocks: int = 0) -> None:
        """Waiting -> running: reference its first `blocks` cached prefix blocks and reserve
        KV for the rest of the prefill of prompt + output so far (evicting unreferenced
        cached blocks when `fits` counted on them)."""
        seq.set_phase(SeqPhase.PREFILL)
        seq.prefill_target = target = seq.prompt_tokens + seq.output_tokens
        prefix = seq.request.prefix
        if prefix:
            seq.held_blocks = blocks
            seq.shared_tokens = self.prefix.acquire(prefix, blocks)
            self.counters.prefix.prompt_tokens += seq.prompt_tokens
            self.counters.prefix.hit_tokens += seq.shared_tokens
        short = target - seq.shared_tokens + 1 - self.kv.room_after_decodes
        if short > 0:
            self.prefix.evict(short)
        # KV handed over by a prefill engine counts as computed, as cached blocks do
        self.counters.received += seq.received_tokens > 0
        seq.computed_tokens = min(max(seq.shared_tokens, seq.received_tokens), target - 1)
        seq.received_tokens = 0  # a later recompute (after a preemption) has it no more
        self.kv.reserve_prefill(target - seq.shared_tokens)
        self.running[seq.id] = seq
        self.prefilling[seq.id] = seq

    def end_prefill(self, seq: Seq) -> None:
        """Its last prompt chunk is computed, or it leaves the GPU: the reservation ends (the
        caller lets it decode or finish)."""
        del self.prefilling[seq.id]
        self.kv.release_prefill(seq.prefill_target - seq.shared_tokens)

    def cache_prompt(self, seq: Seq) -> None:
        """Its prefill is complete: its prefix blocks not yet referenced join the cache."""
        prefix = seq.request.prefix
        if prefix:
            seq.shared_tokens += self.prefix.insert(prefix, seq.held_blocks)
            seq.held_blocks = len(prefix)

    def release_prefix(self, seq: Seq) -> None:
        """It no longer needs its cached blocks (finished, aborted, or recomputes)."""
        if seq.held_blocks:
            self.prefix.release(seq.request.prefix, seq.held_blocks)
        seq.held_blocks = seq.shared_tokens = 0

    def make_room(self, tokens: int) -> bool:
        """Evict unreferenced cached blocks until `tokens` are free after this iteration's
        decodes; False (nothing evicted) when even all of them would not do."""
        room = self.kv.room_after_decodes
        if tokens <= room:
            return True
        if tokens > room + self.prefix.idle_tokens:
            return False
        self.prefix.evict(tokens - room)
        return True

    def preempt(self, seq: Seq) -> None:
        """Take a running sequence off the GPU for KV room: to CPU in swap mode when it fits
        (it comes back on its own), else recompute (KV dropped, front of the queue)."""
        swap = self.config.preemption_mode == "swap"
        if swap and self.gpu_tokens(seq) <= self.kv.cpu_free_tokens:
            self.counters.preemptions_swap += 1
            self.swap_to_cpu(seq)
            self.resumable[seq.id] = seq
            return
        self.counters.preemptions_recompute += 1
        self.release_gpu(seq)
        self.release_prefix(seq)
        seq.computed_tokens = 0
        self.enqueue(seq, front=True)

    def swap_to_cpu(self, seq: Seq) -> None:
        """Move a sequence out of the GPU: its KV (if any) goes to CPU; it stops running."""
        if seq.phase is SeqPhase.WAITING:
            seq.resume_phase = SeqPhase.WAITING
            seq.cpu_tokens = 0
        else:
            seq.resume_phase = seq.phase
            seq.cpu_tokens = self.release_gpu(seq)
        self.kv.swap_to_cpu(seq.cpu_tokens)
        self.counters.swapped_tokens += seq.cpu_tokens
        seq.set_phase(SeqPhase.SWAPPED)
        self.swapped[seq.id] = seq

    def swap_to_gpu(self, seq: Seq) -> None:
        """Bring a swapped sequence's KV back; it runs in the phase it left."""
        del self.swapped[seq.id]
        self.resumable.pop(seq.id, None)
        self.kv.swap_to_gpu(seq.cpu_tokens)
        self.counters.swapped_tokens += seq.cpu_tokens
        seq.cpu_tokens = 0
        self.running[seq.id] = seq
        if seq.resume_phase is SeqPhase.DECODE:
            self.decode.join(seq)
        else:
            seq.set_phase(SeqPhase.PREFILL)
            self.kv.reserve_prefill(seq.prefill_target - seq.shared_tokens)
            self.prefilling[seq.id] = seq

    def pause(self, seqs: Iterable[Seq]) -> None:
        """swap_out: to CPU (a waiting sequence with no KV), and no coming back before
        resume."""
        for seq in seqs:
            if seq.phase is SeqPhase.SWAPPED:
                self.resumable.pop(seq.id, None)
            else:
                self.swap_to_cpu(seq)
            seq.paused = True

    def resume(self, seqs: Iterable[Seq]) -> None:
        """swap_in: paused sequences may come back (a waiting one rejoins the queue's front);
        others are ignored."""
        for seq in seqs:
            if seq.phase is not SeqPhase.SWAPPED or not seq.paused:
                continue
            seq.paused = False
            if seq.resume_phase is SeqPhase.WAITING:
                del self.swapped[seq.id]
                self.enqueue(seq, front=True)
            else:
                self.resumable[seq.id] = seq

    def release_gpu(self, seq: Seq) -> int:
        """Take a running sequence off the GPU; returns the KV tokens of its own it had
        computed (its cached prefix blocks stay referenced)."""
        self.running.pop(seq.id, None)
        if seq.phase is SeqPhase.DECODE:
            self.decode.leave(seq)
            held = seq.prompt_tokens + seq.output_tokens
        else:
            self.end_prefill(seq)
            held = seq.computed_tokens
        seq.set_phase(SeqPhase.WAITING)
        return max(0, held - seq.shared_tokens)

    def finish(self, seq: Seq) -> None:
        """It generated its last token (out of the decode batch already)."""
        self.running.pop(seq.id, None)
        self.release_prefix(seq)
        self.retire(seq)
        self.counters.finished += 1

    def drop(self, seq: Seq) -> None:
        """Remove a live sequence from wherever it is (abort); its KV is freed at once."""
        if seq.phase in (SeqPhase.DECODE, SeqPhase.PREFILL):
            self.release_gpu(seq)
        elif seq.phase is SeqPhase.SWAPPED:
            self.kv.free_cpu(seq.cpu_tokens)
            del self.swapped[seq.id]
            self.resumable.pop(seq.id, None)
        self.release_prefix(seq)
        self.retire(seq)

    def retire(self, seq: Seq) -> None:
        seq.set_phase(SeqPhase.DONE)
        del self.seqs[seq.id]

    def gpu_tokens(self, seq: Seq) -> int:
        """KV tokens a sequence has computed on the GPU (what a swap moves)."""
        if seq.phase is SeqPhase.DECODE:
            return seq.prompt_tokens + self.decode.output_tokens(seq) - seq.shared_tokens
        if seq.phase is SeqPhase.PREFILL:
            return max(0, seq.computed_tokens - seq.shared_tokens)
        return 0
