"""Where each sequence of the engine model is, and the moves between places.

Question answered: which sequences wait, run (prefill or decode) or sit swapped out, and what
does moving one do to the decode batch and the KV cache? `SeqQueues` holds the live sequences by
id, the FCFS waiting queue, the running set in admission order (preemption victims are taken
from its end), the prefilling subset, the swapped sequences and the resumable subset of those
(swapped by preemption, not paused by swap_out: they come back on their own). Each move keeps
the queues, the decode batch (decode_batch.py), the KV accounting (kv_cache.py) and the
counters consistent; which move to make, and when, is the scheduler's (scheduler.py) or the
caller's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from qlm.engine.config import EngineConfig
from qlm.engine.decode_batch import DecodeBatch
from qlm.engine.kv_cache import KvCache
from qlm.engine.sequence import Seq, SeqPhase
from qlm.engine.stats import EngineCounters
from qlm.engine.types import EngineRequest


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
        self.kv = KvCache(self.decode, cpu_capacity_tokens=config.cpu_swap_tokens)

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

    def admit(self, seq: Seq) -> None:
        """Waiting -> running: reserve KV for the whole prefill of prompt + output so far."""
        seq.set_phase(SeqPhase.PREFILL)
        seq.prefill_target = seq.prompt_tokens + seq.output_tokens
        seq.computed_tokens = 0
        self.kv.reserve_prefill(seq.prefill_target)
        self.running[seq.id] = seq
        self.prefilling[seq.id] = seq

    def end_prefill(self, seq: Seq) -> None:
        """Its last prompt chunk is computed: the reservation ends (the caller lets it
        decode or finish)."""
        del self.prefilling[seq.id]
        self.kv.release_prefill(seq.prefill_target)

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
            self.kv.reserve_prefill(seq.prefill_target)
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
        """Take a running sequence off the GPU; returns the KV tokens it had computed."""
        self.running.pop(seq.id, None)
        if seq.phase is SeqPhase.DECODE:
            self.decode.leave(seq)
            held = seq.prompt_tokens + seq.output_tokens
        else:
            self.end_prefill(seq)
            held = seq.computed_tokens
        seq.set_phase(SeqPhase.WAITING)
        return held

    def finish(self, seq: Seq) -> None:
        """It generated its last token (out of the decode batch already)."""
        self.running.pop(seq.id, None)
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
        self.retire(seq)

    def retire(self, seq: Seq) -> None:
        seq.set_phase(SeqPhase.DONE)
        del self.seqs[seq.id]

    def gpu_tokens(self, seq: Seq) -> int:
        """KV tokens a sequence has computed on the GPU (what a swap moves)."""
        if seq.phase is SeqPhase.DECODE:
            return seq.prompt_tokens + self.decode.output_tokens(seq)
        if seq.phase is SeqPhase.PREFILL:
            return seq.computed_tokens
        return 0
