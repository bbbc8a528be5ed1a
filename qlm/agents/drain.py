"""How long an engine's admitted work will take to drain: the busy_s the planner needs."""

from __future__ import annotations

from qlm.agents.reconcile import EngineTiming
from qlm.engine.types import EngineObservation, EngineState
from qlm.perf.profile import Profile

# Tokens per engine iteration (vLLM's default max_num_batched_tokens; the simulated engine's
# default chunk_tokens): decodes take one each, prefill chunks the rest.
CHUNK_TOKENS = 2048


def drain_estimate_s(obs: EngineObservation, profile: Profile | None) -> float:
    """Remaining decode work of the active requests over the profile's throughput at that
    batch size, plus their outstanding prefill; a loading engine adds its load time."""
    if profile is None:
        return 0.0
    load_s = profile.load_s if obs.state is EngineState.LOADING else 0.0
    active = obs.active
    if not active:
        return load_s
    remaining_tokens = sum(max(0, r.max_output_tokens - r.output_tokens) for r in active)
    prefill_tokens = sum(r.prompt_tokens for r in active if not r.started)
    batch = min(len(active), profile.max_batch_size)
    decode_s = remaining_tokens / profile.token_throughput_per_s(batch)
    return load_s + decode_s + profile.prefill_s(prefill_tokens)


def engine_timing(
    obs: EngineObservation, profile: Profile | None, now_s: float
) -> EngineTiming | None:
    """The engine's speed now, from its profile, for reconcile's preemption check and its
    bound on queued prefill: prefill runs beside the sequences decoding now."""
    if profile is None or obs.model is None:
        return None
    step_s = profile.decode_step_s_at(max(1, len(obs.active)))
    decoding = [r for r in obs.active if r.started]
    context_tokens = sum(r.context_tokens for r in decoding)
    beside = prefill_rate_beside(profile, len(decoding), context_tokens)
    return EngineTiming(now_s, step_s, profile.prefill_tokens_per_s, beside)


def prefill_rate_beside(
    profile: Profile, decoding: int, context_tokens: int, chunk_tokens: int = CHUNK_TOKENS
) -> float:
    """Prefill tokens per second while `decoding` sequences holding `context_tokens` in all
    decode: each iteration gives every one of them a token and the rest of its token budget
    to prefill chunks (`Profile.iteration_s`: the engine's step model). A chunk's attention
    to its own prompt's earlier tokens is left out, so long prompts look a little faster."""
    chunk = max(1, chunk_tokens - decoding)
    return chunk / profile.iteration_s(chunk, decoding, context_tokens + chunk)
