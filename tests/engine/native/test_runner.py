"""The runner under block pressure with forks (qlm/engine/native/runner.py), on a tiny random
Llama: what it refuses, and that waiting forks holding blocks never stall it."""

from __future__ import annotations

import pytest

from qlm.engine.native.runner import NativeRunner, RunnerConfig
from qlm.engine.native.sequence import Sampling
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
