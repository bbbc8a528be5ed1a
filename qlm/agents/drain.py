"""How long an engine's admitted work will take to drain: the busy_s the planner needs."""

from __future__ import annotations

from qlm.engine.types import EngineObservation, EngineState
from qlm.perf.profile import Profile


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
