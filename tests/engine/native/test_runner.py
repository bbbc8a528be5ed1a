"""The runner under block pressure with forks (qlm/engine/native/step_runner.py), on a tiny random
Llama: what it refuses, and that waiting forks holding blocks never stall it."""

from __future__ import annotations

import pytest

from qlm.engine.native.paged_sequence import Sampling
from qlm.engine.native.runner_config import RunnerConfig
from qlm.engine.native.step_runner import NativeRunner
from tests.engine.native.helpers import random_checkpoint

GREEDY = Sampling(max_tokens=2, temperature=0.0, ignore_eos=True)


def small_runner() -> NativeRunner:
    config = RunnerConfig(block_size=8, num_blocks=6, max_num_seqs=4, max_batched_tokens=48)
    return NativeRunner(random_checkpoint(), config)


def test_a_fork_too_long_for_the_cache_or_of_no_parent_is_refused() -> None:
    runner = small_runner()
    runner.add("p", list(range(37)), GREEDY)
    runner.step()
    with pytest.raises(ValueError, match="c: prompt and max_tokens exceed the KV cache"):
        runner.fork("p", "c", Sampling(max_tokens=20))
    with pytest.raises(ValueError, match="no sequence q to fork"):
        runner.fork("q", "c", GREEDY)
    with pytest.raises(ValueError, match="exceed the model's 2048 positions"):
        NativeRunner(random_checkpoint()).add("long", [1] * 2048, GREEDY)


def test_waiting_forks_give_their_blocks_back_when_nothing_else_can_run() -> None:
    """The parent ends while its fork waits behind a prompt that needs the fork's blocks."""
    runner = small_runner()
    runner.add("p", list(range(37)), GREEDY)
    runner.step()
    runner.add("s", list(range(20)), GREEDY)
    runner.fork("p", "c", GREEDY)
    ended: set[str] = set()
    for _ in range(50):
        if not runner.has_work:
            break
        ended |= {e.seq_id for e in runner.step().emitted if e.finish is not None}
    assert ended == {"p", "s", "c"}
    assert runner.pool.free_blocks == 6


def run(runner: NativeRunner) -> tuple[dict[str, list[int]], int]:
    out: dict[str, list[int]] = {}
    hits = 0
    while runner.has_work:
        result = runner.step()
        hits += result.prefix_hit_tokens
        for emitted in result.emitted:
            out.setdefault(emitted.seq_id, []).append(emitted.token)
    return out, hits


def test_a_later_request_takes_its_cached_prefix_and_generates_the_same() -> None:
    """Three requests one after another: b shares a's 40-token prefix and takes its two full
    blocks of 16 from the cache, c shares its first 20 tokens and takes one; the outputs equal
    those of a runner without the cache."""
    prefix = [(3 * i + 1) % 64 for i in range(40)]
    prompts = {"a": [*prefix, 5, 6], "b": [*prefix, 7], "c": prefix[:20] + [9] * 30}
    greedy = Sampling(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs = {}
    for caching in (True, False):
        runner = NativeRunner(random_checkpoint(), RunnerConfig(prefix_caching=caching))
        hits, out = 0, {}
        for seq_id, prompt in prompts.items():
            runner.add(seq_id, prompt, greedy)
            tokens, hit = run(runner)
            hits, out = hits + hit, out | tokens
        outputs[caching] = out
        assert hits == (16 * 2 + 16 if caching else 0)  # b: both blocks; c: the first
    assert outputs[True] == outputs[False]


def test_cached_blocks_are_reused_least_recently_released_first() -> None:
    greedy = Sampling(max_tokens=1, temperature=0.0, ignore_eos=True)
    config = RunnerConfig(block_size=8, num_blocks=6, max_num_seqs=4, max_batched_tokens=48)
    runner = NativeRunner(random_checkpoint(), config)
    first, second = list(range(17)), list(range(20, 37))  # two full blocks each
    for seq_id, prompt in (("first", first), ("second", second)):
        runner.add(seq_id, prompt, greedy)
        run(runner)
    assert runner.pool.cached_blocks == 4
    runner.add("other", [50] * 17, greedy)  # 3 blocks: 2 free, then `first`'s tail block
    run(runner)
    runner.add("again-second", second, greedy)
    runner.add("again-first", first, greedy)
    assert run(runner)[1] == 16 + 8  # second whole; first its first block only


def test_requests_taking_the_same_cached_prefix_read_it_once_per_step() -> None:
    """Three requests after a fourth with the same 48-token prefix: they take its three
    blocks from the cache, decode together reading them once, and generate what they do
    without the cache and without shared reads."""
    prefix = [(5 * i + 2) % 64 for i in range(48)]
    greedy = Sampling(max_tokens=4, temperature=0.0, ignore_eos=True)
    results = []
    for caching in (True, False):
        config = RunnerConfig(prefix_caching=caching, shared_prefix=caching)
        runner = NativeRunner(random_checkpoint(), config)
        runner.add("system", [*prefix, 1], greedy)
        run(runner)
        for i in range(3):
            runner.add(f"user{i}", [*prefix, 10 + i, 20 + i], greedy)
        saved = hits = 0
        out: dict[str, list[int]] = {}
        while runner.has_work:
            result = runner.step()
            saved += result.shared_prefix_reads_saved
            hits += result.prefix_hit_tokens
            for emitted in result.emitted:
                out.setdefault(emitted.seq_id, []).append(emitted.token)
        results.append(out)
        if caching:
            assert hits == 3 * 48
            assert saved >= 2 * 48  # the three decode together over the same three blocks
    assert results[0] == results[1]
