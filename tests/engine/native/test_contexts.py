"""Parrot's context operations on the native runner (qlm/engine/native/step_runner.py): Fill
computes a context's tokens and keeps its KV, Fork makes a child context sharing the parent's
blocks without a copy, generating from a context continues from its KV, Free gives the blocks
back. Generating from contexts must produce what the same whole prompts produce."""

from __future__ import annotations

import pytest

from qlm.engine.native.paged_sequence import Sampling
from qlm.engine.native.runner_config import RunnerConfig
from qlm.engine.native.step_runner import NativeRunner
from tests.engine.native.helpers import random_checkpoint

GREEDY = Sampling(max_tokens=6, temperature=0.0, ignore_eos=True)
SYSTEM = [(3 * i + 1) % 64 for i in range(45)]  # two full 16-token blocks and 13 tokens
QUESTIONS = {"q0": [5, 9, 2], "q1": [7, 7], "q2": [11, 3, 8, 1]}


def runner(**fields: object) -> NativeRunner:
    settings = {"num_blocks": 64, "prefix_caching": False} | fields
    config = RunnerConfig(**settings)  # type: ignore[arg-type]
    return NativeRunner(random_checkpoint(), config)


def drain(runner: NativeRunner) -> tuple[dict[str, list[int]], int]:
    """Tokens per sequence until nothing runs, and the prefix reads the steps saved."""
    out: dict[str, list[int]] = {}
    saved = 0
    while runner.has_work:
        result = runner.step()
        saved += result.shared_prefix_reads_saved
        for emitted in result.emitted:
            out.setdefault(emitted.seq_id, []).append(emitted.token)
    return out, saved


def test_generating_from_filled_contexts_equals_generating_from_whole_prompts() -> None:
    direct = runner()
    for name, question in QUESTIONS.items():
        direct.add(name, [*SYSTEM, *question], GREEDY)
    expected, _ = drain(direct)

    contexts = runner()
    contexts.fill("system", SYSTEM)
    drain(contexts)
    assert set(contexts.contexts) == {"system"}
    assert contexts.seq("system").computed == len(SYSTEM) - 1  # the last one is the child's
    for name, question in QUESTIONS.items():
        contexts.fill(f"ctx-{name}", question, parent_id="system")
    drain(contexts)
    for name in QUESTIONS:
        contexts.fork(f"ctx-{name}", name, GREEDY)
    got, saved = drain(contexts)
    assert got == expected
    assert saved > 0  # the three children read the system prompt's blocks once a step


def test_fork_shares_the_parents_blocks_and_free_gives_them_back() -> None:
    r = runner()
    free_at_start = r.pool.free_blocks
    r.fill("system", SYSTEM)
    drain(r)
    held = free_at_start - r.pool.free_blocks
    assert held == 3  # 44 computed tokens in 16-token blocks
    r.fill("copy", [], parent_id="system")  # Parrot's Fork: nothing to compute
    assert "copy" in r.contexts
    assert not r.has_work
    assert r.pool.free_blocks == free_at_start - held
    assert all(r.pool.refs(b) == 2 for b in r.seq("system").table.blocks)
    r.fork("copy", "answer", GREEDY)
    out, _ = drain(r)
    assert len(out["answer"]) == 6
    assert r.abort("system")
    assert r.abort("copy")
    assert r.pool.free_blocks == free_at_start
    assert not r.contexts
    assert not r.abort("system")


def test_a_context_too_long_or_of_an_unknown_parent_is_refused() -> None:
    r = runner(num_blocks=4)
    with pytest.raises(ValueError, match="big: prompt and max_tokens exceed the KV cache"):
        r.fill("big", [1] * 70)
    with pytest.raises(ValueError, match="no sequence nobody to fork"):
        r.fill("child", [1], parent_id="nobody")


def test_a_context_filled_under_block_pressure_is_recomputed_and_still_right() -> None:
    """Six blocks: the context fills beside a long generation that then needs its blocks; the
    context's KV goes (its tokens stay) and what continues from it recomputes them, still
    generating the whole prompt's answer."""
    direct = runner()
    direct.add("q", [*SYSTEM, *QUESTIONS["q0"]], GREEDY)
    expected, _ = drain(direct)
    r = runner(num_blocks=6, block_size=16, max_batched_tokens=16, max_num_seqs=4)
    r.add("hog", [1] * 20, Sampling(max_tokens=60, temperature=0.0, ignore_eos=True))
    r.fill("system", SYSTEM)
    out, _ = drain(r)
    assert len(out["hog"]) == 60
    assert not r.seq("system").table.blocks
    assert "system" in r.contexts
    r.fill("ctx", QUESTIONS["q0"], parent_id="system")
    drain(r)
    r.fork("ctx", "q", GREEDY)
    got, _ = drain(r)
    assert got["q"] == expected["q"]
