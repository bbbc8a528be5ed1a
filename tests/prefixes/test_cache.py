"""The engine model's prefix cache: hits skip prefill, blocks are shared once in KV, the least
recently used unreferenced blocks go first, and the KV accounting stays exact throughout."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qlm.config.engine_config import EngineConfig
from qlm.engine.model.core import EngineModel
from qlm.engine.model.scheduler import prefix_order
from qlm.engine.model.sequence import Seq, SeqPhase
from qlm.prefixes.cache import PrefixCache, PrefixCounters
from qlm.types import PrefixBlock, Request
from tests.engine.helpers import (
    OPERATIONS,
    apply_operation,
    conservation_engine,
    engine,
    finishes,
    first_tokens,
    req,
    run_all,
)


def _blocks(*spec: tuple[int, int]) -> tuple[PrefixBlock, ...]:
    return tuple(PrefixBlock(key, tokens) for key, tokens in spec)


def _with_prefix(request: Request, *spec: tuple[int, int]) -> Request:
    return replace(request, prefix=_blocks(*spec))


def test_a_cached_prefix_is_not_computed_again() -> None:
    model = engine()
    model.add(_with_prefix(req("a", prompt=120, output=1), (1, 50), (2, 50)), 0.0)
    model.advance_to(1.0)
    model.add(_with_prefix(req("b", prompt=120, output=1, at_s=1.0), (1, 50), (2, 50)), 1.0)
    events = run_all(model)
    # b computes its own 20 tokens: 10 ms + 20 x 0.1 ms + 120 tokens of context x 1 us
    assert first_tokens(events)["b"] == pytest.approx(1.0 + 0.010 + 0.002 + 0.00012)
    stats = model.stats
    assert (stats.prefix_prompt_tokens, stats.prefix_hit_tokens) == (240, 100)
    obs = model.observe(1e9)  # what an agent reports (InstanceStatus, qlm_prefix_* metrics)
    assert (obs.prefix_prompt_tokens, obs.prefix_hit_tokens) == (240, 100)
    assert stats.prefill_tokens == 120 + 20
    assert stats.prefix_hit_ratio == pytest.approx(100 / 240)


def test_a_prefix_matches_only_from_its_first_block() -> None:
    model = engine()
    model.add(_with_prefix(req("a", prompt=120, output=1), (1, 50), (2, 50)), 0.0)
    model.advance_to(1.0)
    # same second block key, other first block: nothing is reused
    model.add(_with_prefix(req("b", prompt=120, output=1, at_s=1.0), (3, 50), (2, 50)), 1.0)
    run_all(model)
    assert model.stats.prefix_hit_tokens == 0


def test_requests_without_a_prefix_time_as_before() -> None:
    plain, cached = engine(), engine()
    plain.add(req("a", prompt=300, output=5), 0.0)
    cached.add(_with_prefix(req("a", prompt=300, output=5), (9, 200)), 0.0)
    assert finishes(run_all(plain)) == finishes(run_all(cached))


def test_shared_blocks_count_once_in_kv() -> None:
    model = engine()
    model.add(_with_prefix(req("a", prompt=1000, output=50), (1, 900)), 0.0)
    model.advance_to(0.5)  # a decodes, its 900 prefix tokens cached
    model.add(_with_prefix(req("b", prompt=1000, output=50, at_s=0.5), (1, 900)), 0.5)
    model.advance_to(0.6)  # b decodes too
    obs = model.observe(0.6)
    outputs = sum(r.output_tokens for r in obs.requests)
    assert all(r.started for r in obs.requests)
    # 900 shared once, 100 own prompt tokens each, and the tokens generated so far
    assert obs.kv_used_tokens == 900 + 2 * 100 + outputs


def test_the_least_recently_used_unreferenced_blocks_are_evicted_first() -> None:
    model = engine(capacity_tokens=1000)
    model.add(_with_prefix(req("a", prompt=400, output=1), (1, 400)), 0.0)
    model.advance_to(1.0)
    model.add(_with_prefix(req("b", prompt=400, output=1, at_s=1.0), (2, 400)), 1.0)
    model.advance_to(2.0)
    assert model.observe(2.0).kv_used_tokens == 0  # cached but unreferenced: room
    # c needs 301 tokens of room: 200 are free, so the older of the two blocks goes
    model.add(req("c", prompt=300, output=1, at_s=2.0), 2.0)
    model.advance_to(3.0)
    assert model.stats.prefix_evicted_tokens == 400
    model.add(_with_prefix(req("d", prompt=400, output=1, at_s=3.0), (2, 400)), 3.0)
    run_all(model)
    assert model.stats.prefix_hit_tokens == 400  # b's block was kept


def test_referenced_blocks_are_never_evicted() -> None:
    model = engine(capacity_tokens=1000)
    model.add(_with_prefix(req("a", prompt=500, output=400), (1, 500)), 0.0)
    model.add(req("b", prompt=600, output=1, at_s=0.001), 0.001)
    events = run_all(model)
    # b waits for a to finish (a's 500 cached tokens are in use, not evictable), then a's
    # block, unreferenced, makes room for it
    assert first_tokens(events)["b"] > finishes(events)["a"].at_s
    assert model.stats.prefix_evicted_tokens == 500


def test_a_preempted_sequence_lets_go_of_its_blocks() -> None:
    model = engine(capacity_tokens=300)  # both fit at admission, not once both decode
    model.add(_with_prefix(req("a", prompt=100, output=150), (1, 60)), 0.0)
    model.add(_with_prefix(req("b", prompt=100, output=150), (2, 60)), 0.0)
    done = finishes(run_all(model))
    assert model.stats.preemptions_recompute >= 1
    assert done["a"].output_tokens == done["b"].output_tokens == 150
    cache = model._queues.prefix
    # b's block went idle when b was preempted, and was evicted for a's decodes
    assert model.stats.prefix_evicted_tokens >= 60
    assert cache.idle_tokens == cache.tokens  # nothing holds a reference any more


def test_a_request_whose_prompt_is_all_cached_still_computes_one_token() -> None:
    model = engine()
    model.add(_with_prefix(req("a", prompt=100, output=1), (1, 100)), 0.0)
    model.advance_to(1.0)
    model.add(_with_prefix(req("b", prompt=100, output=1, at_s=1.0), (1, 100)), 1.0)
    events = run_all(model)
    assert first_tokens(events)["b"] == pytest.approx(1.0 + 0.010 + 0.0001 + 0.0001)
    assert model.stats.prefill_tokens == 101


def test_the_cache_unit_releases_leaf_first_and_shares_duplicates() -> None:
    cache = PrefixCache(PrefixCounters())
    chain = _blocks((1, 10), (2, 20), (3, 30))
    assert cache.insert(chain, 0) == 60  # one sequence computed it all
    assert cache.insert(chain[:2], 0) == 30  # another computed the first two: shared
    assert cache.tokens == 60
    cache.release(chain[:2], 2)
    cache.release(chain, 3)
    assert cache.idle_tokens == 60
    assert cache.evict(25) == 30  # the leaf went first
    assert cache.match(chain) == 2
    assert cache.idle_within(chain, 2) == 30


def test_a_request_whose_prefix_is_longer_than_its_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="prefix"):
        _with_prefix(req("a", prompt=100), (1, 60), (2, 60))


# ---------------------------------------------------------------- Preble's local order


def test_prefix_groups_interleave_by_priority_in_proportion() -> None:
    model = engine(config=EngineConfig(waiting_order="prefix-groups", prefix_groups=2))
    model.add(_with_prefix(req("warm", prompt=100, output=1), (1, 100)), 0.0)
    model.advance_to(1.0)  # block 1 (100 tokens) is cached now
    queues = model._queues
    shares = {"a": 0, "b": 100, "c": 60, "d": 0, "e": 100, "f": 100, "g": 100}
    seqs = []
    for name, cached in shares.items():
        request = req(name, prompt=100 if cached else 50, output=1)
        if cached == 100:
            request = _with_prefix(request, (1, 100))
        elif cached:
            request = replace(request, prompt_tokens=166, prefix=_blocks((1, 100)))
        seqs.append(Seq.for_request(request, len(seqs), 10_000, None))
    order = [seq.id for seq in prefix_order(queues, seqs)]
    # groups 2 (all cached): b e f g; 1 (60 %): c; 0: a d. Rounds give 3, 2 and 1 a group.
    assert order == ["b", "e", "f", "c", "a", "g", "d"]


def test_prefix_groups_admit_a_cached_request_before_an_earlier_uncached_one() -> None:
    def first_of(order: str) -> str:
        settings = {"waiting_order": order, "max_num_seqs": 1, "max_wait_iterations": 10**6}
        config = EngineConfig.model_validate(settings)  # no bound: "busy" takes 200 steps
        model = engine(config=config)
        model.add(_with_prefix(req("warm", prompt=500, output=1), (1, 500)), 0.0)
        model.advance_to(1.0)
        model.add(req("busy", prompt=100, output=200, at_s=1.0), 1.0)  # holds the slot
        model.add(req("cold", prompt=600, output=1, at_s=1.001), 1.001)
        hot = _with_prefix(req("hot", prompt=600, output=1, at_s=1.002), (1, 500))
        model.add(hot, 1.002)
        events = run_all(model)
        starts = first_tokens(events)
        return min(("cold", "hot"), key=starts.__getitem__)

    assert first_of("fcfs") == "cold"
    assert first_of("prefix-groups") == "hot"


# ---------------------------------------------------------------- conservation

CHAINS = (_blocks((1, 64), (2, 64)), _blocks((1, 64), (3, 32)), _blocks((4, 128)), ())

operations = st.lists(
    st.tuples(
        st.sampled_from(OPERATIONS),
        st.floats(0.0, 0.3),
        st.integers(0, 30),
        st.integers(1, 400),
        st.integers(1, 200),
        st.integers(0, len(CHAINS) - 1),
    ),
    max_size=60,
)


def _kv_by_hand(model: EngineModel) -> int:
    """KV in use recounted from the sequences and the cache (the cache's own books)."""
    queues = model._queues
    total = queues.prefix.tokens
    for seq in queues.seqs.values():
        if seq.phase is SeqPhase.DECODE:
            total += seq.prompt_tokens + queues.decode.output_tokens(seq) - seq.shared_tokens
        elif seq.phase is SeqPhase.PREFILL:
            total += seq.prefill_target - seq.shared_tokens + 1
    return total


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=operations,
    mode=st.sampled_from(["recompute", "swap"]),
    order=st.sampled_from(["fcfs", "prefix-groups", "srpt-mlfq"]),
)
def test_kv_books_balance_under_any_operations(
    ops: list[tuple[str, float, int, int, int, int]], mode: str, order: str
) -> None:
    model = conservation_engine(mode, order)
    added: set[str] = set()
    t = 0.0
    for op, gap, k, prompt, output, chain in ops:
        t += gap
        model.advance_to(t)
        blocks = CHAINS[chain]
        tokens = max(prompt, sum(b.tokens for b in blocks))
        request = replace(req(f"r{k}", prompt=tokens, output=output), prefix=blocks)
        apply_operation(model, op, request, t, added)
        model.observe(t)
        assert model._queues.kv.used_tokens == _kv_by_hand(model)
        obs = model.observe(t)
        assert 0 <= obs.kv_used_tokens <= obs.kv_capacity_tokens
    model.swap_in(list(added), t)
    model.advance_to(t + 1e6)
    queues = model._queues
    assert not queues.seqs
    assert queues.prefix.idle_tokens == queues.prefix.tokens == queues.kv.used_tokens
