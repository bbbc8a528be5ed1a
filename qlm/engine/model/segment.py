"""The iterations in flight: one mixed iteration, or a run of identical decode steps.

Question answered: what is the engine computing now, when does it end, and how many of its
steps are done by a given time? An iteration that prefills runs alone (`steps == 1`, with its
prefill `chunks`). An iteration that only decodes cannot change until the next finish, the next
KV exhaustion or the next operation, so the whole run of decode steps up to the first of those
is one segment, timed in closed form by `DecodeRun` (qlm/perf/step.py): step k of a run of n
sequences takes `first + k * growth`. KV swap traffic since the last plan lengthens the
segment's first iteration by tokens x kv_bytes_per_token / swap_bytes_per_s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from qlm.engine.model.seq_queues import SeqQueues
from qlm.engine.model.sequence import Seq
from qlm.perf.profile import Profile
from qlm.perf.step import DecodeRun


class Chunk(NamedTuple):
    """Prompt tokens of one sequence computed in a planned iteration."""

    seq: Seq
    version: int  # the sequence's version at planning; a changed one voids the chunk
    tokens: int


@dataclass(frozen=True, slots=True)
class Segment:
    """Iterations in flight: `steps` decode steps timed by `run`, or (steps == 1) one
    iteration that also prefills `chunks`."""

    start_s: float
    steps: int
    run: DecodeRun
    chunks: tuple[Chunk, ...] = ()
    preempted: bool = False  # its plan preempted (so it admitted nothing)
    swap_tokens: int = 0  # KV traffic charged to its first step

    @property
    def end_s(self) -> float:
        return self.start_s + self.run.duration_s(self.steps)

    def steps_done_by(self, at_s: float) -> int:
        return self.run.steps_done_by(at_s - self.start_s, self.steps)


def plan_segment(
    at_s: float,
    chunks: Sequence[Chunk],
    preempted: bool,
    queues: SeqQueues,
    profile: Profile,
    swap_bytes_per_s: float,
) -> Segment | None:
    """Time a planned iteration starting at at_s: a mixed one, or a decode run as long as
    nothing can change it; None when there is nothing to run. Takes the swap traffic."""
    n = queues.decode.num_seqs
    swapped = queues.kv.take_swap_traffic()
    swap_s = swapped * profile.kv_bytes_per_token / swap_bytes_per_s
    if chunks:
        prefill = sum(chunk.tokens for chunk in chunks)
        context = queues.decode.context_tokens + sum(
            chunk.seq.computed_tokens + chunk.tokens for chunk in chunks
        )
        step = DecodeRun(profile.iteration_s(prefill, n, context) + swap_s)
        return Segment(at_s, 1, step, tuple(chunks), preempted, swapped)
    if n == 0:
        return None
    run = profile.decode_run(n, queues.decode.context_tokens)
    if swap_s > 0 or preempted:
        step = DecodeRun(run.first_step_s + swap_s)
        return Segment(at_s, 1, step, (), preempted, swapped)
    return Segment(at_s, _decode_run_steps(queues), run)


def _decode_run_steps(queues: SeqQueues) -> int:
    """Decode steps until the first finish or until the KV cache is full."""
    until_finish = queues.decode.steps_to_next_finish()
    until_full = queues.kv.decode_steps_until_full()
    return max(1, min(until_finish, until_full))
