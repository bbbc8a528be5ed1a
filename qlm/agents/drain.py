"""How long an engine's admitted work will take to drain: the busy_s the planner needs."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from qlm.agents.reconcile import EngineTiming
from qlm.engine.engine_types import EngineObservation, EngineRequest, EngineState
from qlm.perf.profile import Profile

# Tokens per engine iteration (vLLM's default max_num_batched_tokens; the simulated engine's
# default chunk_tokens): decodes take one each, prefill chunks the rest.
CHUNK_TOKENS = 2048


def drain_estimate_s(
    obs: EngineObservation, profile: Profile | None, load_left_s: float | None = None
) -> float:
    """Remaining decode work of the active requests over the profile's throughput at that
    batch size, plus their outstanding prefill; a loading engine adds its load time
    (`load_left_s` when the caller knows what is left of it, a wake's or a cold load's;
    else the profile's cold `load_s`)."""
    if profile is None:
        return 0.0
    return drains_by_rank(obs, profile, lambda _: 0, (0,), load_left_s)[0]


def load_left_s(profile: Profile | None, warm: bool, elapsed_s: float) -> float | None:
    """What is left of a load that began `elapsed_s` ago: from the standby tier (`warm`) or
    cold (qlm/engine/model/tiers.py)."""
    return None if profile is None else max(0.0, profile.load_time_s(warm) - elapsed_s)


def _loading_s(obs: EngineObservation, profile: Profile, load_left_s: float | None) -> float:
    """What is left of a load in progress (`load_left_s`, else the cold `load_s`); 0 when none."""
    if obs.state is not EngineState.LOADING:
        return 0.0
    return profile.load_s if load_left_s is None else load_left_s


def drains_by_rank(
    obs: EngineObservation,
    profile: Profile,
    rank_of: Callable[[EngineRequest], int],
    ranks: Iterable[int],
    load_left_s: float | None = None,
) -> dict[int, float]:
    """For each of `ranks`, `drain_estimate_s` over the active requests of that rank or
    above (`rank_of`), from one pass over them."""
    totals: dict[int, list[int]] = {}  # rank -> [requests, tokens left to decode, prefill]
    for r in obs.active:
        total = totals.setdefault(rank_of(r), [0, 0, 0])
        total[0] += 1
        total[1] += max(0, r.max_output_tokens - r.output_tokens)
        if not r.started:
            total[2] += r.prompt_tokens
    load_s = _loading_s(obs, profile, load_left_s)
    drains = {}
    for rank in ranks:
        above = [t for k, t in totals.items() if k >= rank]
        count = sum(t[0] for t in above)
        if not count:
            drains[rank] = load_s
            continue
        batch = min(count, profile.max_batch_size)
        decode_s = sum(t[1] for t in above) / profile.token_throughput_per_s(batch)
        drains[rank] = load_s + decode_s + profile.prefill_s(sum(t[2] for t in above))
    return drains


def start_blocks_by_rank(
    obs: EngineObservation,
    profile: Profile,
    rank_of: Callable[[EngineRequest], int],
    ranks: Iterable[int],
    load_left_s: float | None = None,
) -> dict[int, float]:
    """For each of `ranks`, how long the engine's admitted work delays the first token of a
    new request of that rank. Continuous batching starts a new request beside the sequences
    decoding: their decode does not wait to end first, it slows the prefill lane (priced by
    `prefill_rate_beside`). What delays it: a load in progress; the admitted prompts of that
    rank or above not prefilled yet (they go first), at the lane's rate; and, when the
    engine has no room for one more request like those it holds (no sequence slot, or less
    free KV than they hold on average) and holds nothing it may preempt (all of that rank
    or above), the decode steps until the first of them ends. (`drains_by_rank` is the
    other question: how long until all of it is done.)"""
    load_s = _loading_s(obs, profile, load_left_s)
    active = obs.active
    if not active:
        return dict.fromkeys(ranks, load_s)
    decoding = [r for r in active if r.started]
    lane = prefill_rate_beside(profile, len(decoding), sum(r.context_tokens for r in decoding))
    full = obs.free_slots == 0 or obs.free_kv_tokens * len(active) < obs.kv_used_tokens
    step_s = profile.decode_step_s_at(len(active))
    blocks = {}
    for rank in ranks:
        above = [r for r in active if rank_of(r) >= rank]
        queued_s = sum(r.prompt_tokens for r in above if not r.started) / lane
        room_s = 0.0
        if full and len(above) == len(active):
            room_s = min(max(0, r.max_output_tokens - r.output_tokens) for r in above) * step_s
        blocks[rank] = load_s + queued_s + room_s
    return blocks


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
