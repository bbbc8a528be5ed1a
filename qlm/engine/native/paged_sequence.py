"""One sequence inside the native engine: its tokens, its KV blocks, how it samples and ends.

Question answered: what does the engine know about a request between steps? The tokens so far
(prompt, then output), how many of them have K and V in the cache (`computed`), its block
table, and its sampling settings. A sequence needs `pending` more tokens computed before its
next token can be sampled: its prompt (or what is left of it, in chunks) at first, then one per
decode step; after a preemption (blocks freed) all of them again.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from qlm.engine.native.blocks import BlockTable


class Finish(enum.StrEnum):
    STOP = "stop"  # an end-of-sequence or stop token
    LENGTH = "length"  # max_tokens generated


@dataclass(frozen=True, slots=True)
class Sampling:
    """temperature 0 is greedy; otherwise softmax at `temperature` over the smallest set of
    tokens whose probability reaches `top_p`, drawn with the request's own generator (seeded
    when `seed` is set, so the same request draws the same tokens in any batch)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


@dataclass(slots=True, eq=False)  # identity: `seq in running` must not compare fields
class Seq:
    seq_id: str
    prompt: tuple[int, ...]
    sampling: Sampling
    table: BlockTable = field(default_factory=BlockTable)
    output: list[int] = field(default_factory=list)
    computed: int = 0  # leading tokens whose K and V are in the cache
    finish: Finish | None = None
    queued_step: int = 0  # the engine step it arrived at (kept through preemptions)
    hashes: list[bytes] = field(default_factory=list)  # prefix-cache names of its full blocks
    lookahead_keys: list[bytes] = field(default_factory=list)  # same, computed or not (memo)
    # A context (Parrot's Fill): computes its tokens but the last (which whoever continues
    # from it computes, for the logits), samples nothing, and keeps its KV until freed.
    context: bool = False
    generator: torch.Generator = field(default_factory=torch.Generator)
    _tokens: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self._tokens = [*self.prompt, *self.output]
        if not self.prompt:
            raise ValueError(f"sequence {self.seq_id}: empty prompt")
        if self.sampling.seed is not None:
            self.generator.manual_seed(self.sampling.seed)
        else:
            self.generator.seed()

    @property
    def tokens(self) -> Sequence[int]:
        """Prompt then output (kept as one list: steps slice it, so no copy per step)."""
        return self._tokens

    @property
    def length(self) -> int:
        return len(self._tokens)

    @property
    def pending(self) -> int:
        """Tokens to compute before the next one can be sampled."""
        return self.length - self.computed

    @property
    def to_compute(self) -> int:
        """Tokens the runner has left to compute for it (a context leaves its last one)."""
        return self.pending - 1 if self.context else self.pending

    def sample(self, logits: torch.Tensor) -> int:
        s = self.sampling
        if s.temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / s.temperature, dim=-1)
        if s.top_p < 1:
            ordered, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(ordered, 0) - ordered < s.top_p  # at least the first
            probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def append(self, token: int, eos_token_ids: Sequence[int]) -> Finish | None:
        """Record a sampled token; the reason the sequence ends with it, if it does."""
        self.output.append(token)
        self._tokens.append(token)
        s = self.sampling
        if token in s.stop_token_ids or (not s.ignore_eos and token in eos_token_ids):
            self.finish = Finish.STOP
        elif len(self.output) >= s.max_tokens:
            self.finish = Finish.LENGTH
        return self.finish
