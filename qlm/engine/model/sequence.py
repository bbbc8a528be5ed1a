"""One request inside the engine model: its phase and the tokens it has computed and made.

Question answered: where is a request in the engine's lifecycle, and what does it hold?
`SeqPhase` is the lifecycle, `TRANSITIONS` the one table of the moves between phases, and `Seq`
the request's state. Every phase change bumps `Seq.version`, which invalidates the entries the
waiting queue, the decode batch's finish heap and planned prefill chunks hold for the old phase
(they are skipped, not searched for and removed).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from qlm.engine.engine_types import HandedOff
from qlm.types import Request


class SeqPhase(StrEnum):
    WAITING = "waiting"  # in the engine's queue; holds no KV
    PREFILL = "prefill"  # admitted; KV reserved for its whole prefill; chunks in progress
    DECODE = "decode"  # produces one token per iteration
    SWAPPED = "swapped"  # KV on CPU (or paused while waiting); not scheduled
    DONE = "done"  # finished or aborted


# Phase -> the phases it may move to. WAITING -> WAITING requeues (a new queue position); a
# running sequence leaves the GPU through WAITING, also on its way to SWAPPED.
TRANSITIONS: dict[SeqPhase, frozenset[SeqPhase]] = {
    SeqPhase.WAITING: frozenset(
        {SeqPhase.WAITING, SeqPhase.PREFILL, SeqPhase.SWAPPED, SeqPhase.DONE}
    ),
    SeqPhase.PREFILL: frozenset({SeqPhase.DECODE, SeqPhase.WAITING, SeqPhase.DONE}),
    SeqPhase.DECODE: frozenset({SeqPhase.WAITING, SeqPhase.DONE}),
    SeqPhase.SWAPPED: frozenset(
        {SeqPhase.WAITING, SeqPhase.PREFILL, SeqPhase.DECODE, SeqPhase.DONE}
    ),
    SeqPhase.DONE: frozenset(),
}


@dataclass(slots=True, eq=False)
class Seq:
    """One request inside the engine. While in DECODE its output count is implicit:
    output_tokens + (the decode batch's step - joined_at_step) (decode_batch.py)."""

    request: Request
    target_tokens: int  # tokens it will generate before it stops
    order: int  # submission order in this engine (tie breaker)
    queued_iteration: int = 0  # the engine's iteration count when it was submitted
    phase: SeqPhase = SeqPhase.WAITING
    version: int = 0  # bumped on every phase change; invalidates queue and heap entries
    output_tokens: int = 0
    joined_at_step: int = 0  # the decode batch's step when it last joined the batch
    prefill_target: int = 0  # tokens to (re)compute at admission: prompt + output so far
    computed_tokens: int = 0  # prefill progress
    cpu_tokens: int = 0  # KV on CPU while SWAPPED
    held_blocks: int = 0  # leading prefix blocks it references in the prefix cache
    shared_tokens: int = 0  # their tokens (in its context, held by the cache)
    resume_phase: SeqPhase = SeqPhase.WAITING  # phase to return to from SWAPPED
    paused: bool = False  # swapped out by an operation; waits for swap_in
    first_token_at_s: float | None = None
    received_tokens: int = 0  # KV handed over with it (a decode engine's, until admitted)
    finish_reason: str = "length"  # "length": a cap ended it; "stop": its own length

    @classmethod
    def for_request(
        cls,
        request: Request,
        order: int,
        kv_capacity_tokens: int,
        output_tokens: int | None,
        received: HandedOff | None = None,
    ) -> Seq:
        """A new waiting sequence that generates output_tokens (default: max_output_tokens),
        capped by max_output_tokens and by the KV capacity (like vLLM's max_model_len).
        `received`: it comes from a prefill engine with its KV and the tokens made there."""
        cap = min(request.max_output_tokens, kv_capacity_tokens - request.prompt_tokens)
        stops = output_tokens is not None and output_tokens < cap
        target = max(1, output_tokens) if stops and output_tokens is not None else cap
        seq = cls(request, target, order, finish_reason="stop" if stops else "length")
        if received is not None:
            seq.output_tokens = max(0, received.kv_tokens - request.prompt_tokens)
            seq.received_tokens = received.kv_tokens
            seq.first_token_at_s = received.first_token_at_s
        return seq

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def prompt_tokens(self) -> int:
        return self.request.prompt_tokens

    def set_phase(self, phase: SeqPhase) -> None:
        assert phase in TRANSITIONS[self.phase], f"{self.id}: {self.phase} -> {phase}"
        self.phase = phase
        self.version += 1
