"""The linear step-time model of one engine iteration, and runs of identical decode steps.

One iteration (forward pass) of a continuous-batching engine that prefills `prefill_tokens`
prompt tokens, decodes one token for each of `decode_seqs` sequences and attends over
`context_tokens` KV tokens in all takes

    t = base_s + per_prefill_token_s * prefill_tokens
               + per_decode_seq_s * decode_seqs
               + per_context_token_s * context_tokens

`context_tokens` counts, for every sequence in the iteration, the tokens it holds after the
iteration's work: a decoding sequence counts its prompt plus the tokens generated before this
step; a prefill chunk counts the prompt tokens computed before it plus the chunk.

While a batch of n sequences only decodes, each step adds n tokens of context, so step k
(0-based) of such a run takes first + k * growth with growth = per_context_token_s * n, and
m steps take m * first + growth * m (m - 1) / 2 (`DecodeRun`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Times within this tolerance count as equal (boundaries computed two ways differ by rounding).
TIME_EPS_S = 1e-9


@dataclass(frozen=True, slots=True)
class StepTime:
    """Coefficients of the linear iteration-time model (seconds per unit)."""

    base_s: float
    per_prefill_token_s: float
    per_decode_seq_s: float
    per_context_token_s: float

    def __post_init__(self) -> None:
        if not (self.base_s > 0 and math.isfinite(self.base_s)):
            raise ValueError("step_time.base_s must be a positive finite number")
        if not (self.per_prefill_token_s > 0 and math.isfinite(self.per_prefill_token_s)):
            raise ValueError("step_time.per_prefill_token_s must be a positive finite number")
        for name in ("per_decode_seq_s", "per_context_token_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"step_time.{name} must be a finite number >= 0")

    def iteration_s(
        self, prefill_tokens: float, decode_seqs: float, context_tokens: float
    ) -> float:
        return (
            self.base_s
            + self.per_prefill_token_s * prefill_tokens
            + self.per_decode_seq_s * decode_seqs
            + self.per_context_token_s * context_tokens
        )

    def decode_step_s(self, batch_size: float, context_tokens_per_seq: float) -> float:
        """One decode iteration of batch_size sequences that each hold this many tokens."""
        return self.iteration_s(0, batch_size, batch_size * context_tokens_per_seq)

    def decode_table(
        self, batch_sizes: Sequence[int], context_tokens_per_seq: float
    ) -> tuple[float, ...]:
        """Decode step times at these batch sizes and a typical context length: the table the
        estimator interpolates (Profile.decode_step_s), consistent with this model."""
        return tuple(self.decode_step_s(b, context_tokens_per_seq) for b in batch_sizes)

    @property
    def prefill_tokens_per_s(self) -> float:
        """Marginal prefill rate: a prompt of P tokens prefilled in one chunk adds
        P * (per_prefill_token_s + per_context_token_s) to its iteration."""
        return 1.0 / (self.per_prefill_token_s + self.per_context_token_s)


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """A run of decode iterations with an unchanged batch: step k (0-based) takes
    first_step_s + k * growth_s."""

    first_step_s: float
    growth_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.first_step_s > 0:
            raise ValueError("a decode step must take a positive time")
        if not self.growth_s >= 0:
            raise ValueError("decode step growth must be >= 0")

    def step_s(self, k: int) -> float:
        """Duration of step k (0-based)."""
        return self.first_step_s + k * self.growth_s

    def duration_s(self, steps: int) -> float:
        """Total time of the first `steps` steps (closed form of the arithmetic series)."""
        return steps * self.first_step_s + self.growth_s * steps * (steps - 1) / 2.0

    def steps_done_by(self, elapsed_s: float, max_steps: int) -> int:
        """The most steps (at most max_steps) that complete within elapsed_s; a step ending
        within TIME_EPS_S after elapsed_s counts as complete."""
        if max_steps <= 0:
            return 0
        half_g = self.growth_s / 2.0
        b = self.first_step_s - half_g
        e = max(0.0, elapsed_s)
        root = _positive_root(half_g, b, e) if e > 0 else 0.0
        k = max(0, min(max_steps, math.floor(root)))
        while k < max_steps and self.duration_s(k + 1) <= elapsed_s + TIME_EPS_S:
            k += 1
        while k > 0 and self.duration_s(k) > elapsed_s + TIME_EPS_S:
            k -= 1
        return k


def _positive_root(a: float, b: float, e: float) -> float:
    """The positive root of a k^2 + b k - e = 0 (a >= 0, e > 0), in whichever form avoids
    cancellation."""
    disc = math.sqrt(b * b + 4.0 * a * e)
    if b >= 0:
        return 2.0 * e / (b + disc)
    return (disc - b) / (2.0 * a)
