"""Lower bounds on what one request costs an engine (facts F2-F4 of qlm/sim/bound.py): its
earliest first token after it starts, its prefill work, and the least time of each later token,
priced by the profile's step model (or its table) exactly as the engine model charges them."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from qlm.perf.profile import Profile

Floats = NDArray[np.float64]


def prefill_lower_bound_s(profile: Profile, prompt_tokens: Floats, chunk_tokens: int) -> Floats:
    """Least time from the start of a prompt's prefill to its first token (F2)."""
    chunks = np.ceil(prompt_tokens / chunk_tokens)
    step = profile.step_time
    if step is None:
        return chunks * profile.decode_step_s[0] + prompt_tokens / profile.prefill_tokens_per_s
    return (
        chunks * step.base_s
        + step.per_prefill_token_s * prompt_tokens
        + step.per_context_token_s * _context_sum(prompt_tokens, chunks, chunk_tokens)
    )


def prefill_work_s(profile: Profile, prompt_tokens: Floats, chunk_tokens: int) -> Floats:
    """A prompt's own share of iteration time (F1, F2, F4): the terms no other request pays,
    and its tokens' share of the base time."""
    base_per_token_s = _base_s(profile) / chunk_tokens
    step = profile.step_time
    if step is None:
        return prompt_tokens * (1.0 / profile.prefill_tokens_per_s + base_per_token_s)
    chunks = np.ceil(prompt_tokens / chunk_tokens)
    context = _context_sum(prompt_tokens, chunks, chunk_tokens)
    per_token_s = step.per_prefill_token_s + base_per_token_s
    return per_token_s * prompt_tokens + step.per_context_token_s * context


def token_step_lower_bound_s(
    profile: Profile, prompt_tokens: Floats, chunk_tokens: int
) -> tuple[Floats, Floats]:
    """(least time, own share) of an iteration that gives a request a token after its first
    (F3, F4): a decode step or the last chunk of a recompute, with >= P + 1 tokens of
    context."""
    base_s = _base_s(profile)
    step = profile.step_time
    if step is None:
        zeros = np.zeros_like(prompt_tokens)
        return zeros + base_s, zeros + base_s / chunk_tokens
    own = min(step.per_decode_seq_s, step.per_prefill_token_s) + base_s / chunk_tokens
    own_s = own + step.per_context_token_s * (prompt_tokens + 1)
    return base_s + own_s - base_s / chunk_tokens, own_s


def _base_s(profile: Profile) -> float:
    """The least time of any iteration (F1): the step model's base, or the table's first row."""
    step = profile.step_time
    return profile.decode_step_s[0] if step is None else step.base_s


def _context_sum(prompt_tokens: Floats, chunks: Floats, chunk_tokens: int) -> Floats:
    """sum_{j < chunks} (P - j * chunk): the least total of a prompt's own context terms."""
    return chunks * prompt_tokens - chunk_tokens * chunks * (chunks - 1) / 2.0
