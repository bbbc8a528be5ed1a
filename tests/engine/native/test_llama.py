"""The native engine's forward pass and continuous batching against Hugging Face transformers on
the same random-weight Llama (grouped-query attention, 2 layers): logits at every position,
chunked prefill, paged KV across blocks, forked prefixes with copy-on-write, preemption, and
greedy and seeded sampling. Tolerance: |native - transformers| <= 5e-4 per logit (float32
both; logits of magnitude ~10 differ by up to 7e-5 when sums run in another order)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from qlm.engine.native.blocks import BlockPool, BlockTable, KvCache
from qlm.engine.native.checkpoint import load_checkpoint
from qlm.engine.native.llama import LlamaModel, Piece
from qlm.engine.native.paged_sequence import Sampling
from qlm.engine.native.runner_config import RunnerConfig
from qlm.engine.native.step_runner import NativeRunner
from tests.vllm_fixtures import REPO, vllm_python_or_skip

ATOL, RTOL = 5e-4, 0.0  # float32 both: measured up to 7e-5 (sums in another order)
SPEC = {
    "seed": 3,
    "vocab_size": 300,
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "weight_scale": 4.0,  # logits far apart (greedy ties are unlikely), attention not one-hot
}
PROMPT_A = [(7 * i + 3) % 300 for i in range(37)]
CASES = [
    {"prompt": PROMPT_A, "generate": 6},
    {"prompt": [11, 250, 3, 99, 42], "generate": 12},
    {"prompt": [(5 * i + 1) % 300 for i in range(70)], "generate": 4},
    {"prompt": PROMPT_A[:20] + [(13 * i) % 300 for i in range(9)], "generate": 4},
]
SHARED = 20  # cases 0 and 3 share their first 20 tokens (2.5 blocks of 8)


@dataclass(frozen=True)
class Reference:
    path: Path
    cases: list[dict[str, Any]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    python = vllm_python_or_skip()
    out = tmp_path_factory.mktemp("native-llama")
    subprocess.run(
        [
            str(python),
            str(Path(__file__).with_name("hf_reference.py")),
            str(out),
            json.dumps(SPEC),
            json.dumps(CASES),
        ],
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=True,
        capture_output=True,
        timeout=600,
    )
    return Reference(out / "model", torch.load(out / "reference.pt"))


def forward(
    model: LlamaModel, pool: BlockPool, cache: KvCache, table: BlockTable, tokens: Sequence[int]
) -> torch.Tensor:
    """Compute `tokens` after what `table` holds; the logits of the last one."""
    start = table.num_tokens
    pool.grow(table, len(tokens), cache)
    piece = Piece(
        tokens,
        start,
        pool.slots(table, start, len(tokens)),
        pool.slots(table, 0, start + len(tokens)),
    )
    logits = model.forward([piece], cache)[0]
    table.num_tokens += len(tokens)
    return logits


def setup(reference: Reference, blocks: int = 64) -> tuple[LlamaModel, BlockPool, KvCache]:
    checkpoint = load_checkpoint(reference.path)
    return LlamaModel(checkpoint), BlockPool(blocks, 8), KvCache(checkpoint.shape, blocks, 8)


def test_logits_match_transformers_at_every_chunk_end(reference: Reference) -> None:
    model, pool, cache = setup(reference)
    for case, ref in zip(CASES, reference.cases, strict=True):
        prompt = case["prompt"]
        whole = forward(model, pool, cache, BlockTable(), prompt)
        torch.testing.assert_close(whole, ref["prompt_logits"][-1], atol=ATOL, rtol=RTOL)
        for chunk in (1, 7):  # token by token (decode-shaped), and chunked prefill
            table = BlockTable()
            for start in range(0, len(prompt), chunk):
                logits = forward(model, pool, cache, table, prompt[start : start + chunk])
                at = min(start + chunk, len(prompt)) - 1
                torch.testing.assert_close(logits, ref["prompt_logits"][at], atol=ATOL, rtol=RTOL)
            pool.free(table)


def test_a_batch_of_pieces_gives_each_its_own_logits(reference: Reference) -> None:
    model, pool, cache = setup(reference)
    tables = [BlockTable() for _ in CASES]
    pieces = []
    for table, case in zip(tables, CASES, strict=True):
        n = len(case["prompt"])
        pool.grow(table, n, cache)
        pieces.append(Piece(case["prompt"], 0, pool.slots(table, 0, n), pool.slots(table, 0, n)))
    logits = model.forward(pieces, cache)
    for row, ref in enumerate(reference.cases):
        torch.testing.assert_close(logits[row], ref["prompt_logits"][-1], atol=ATOL, rtol=RTOL)


def test_a_fork_shares_full_blocks_and_copies_the_partial_one_on_write(
    reference: Reference,
) -> None:
    model, pool, cache = setup(reference)
    parent = BlockTable()
    forward(model, pool, cache, parent, PROMPT_A[:SHARED])
    child = pool.fork(parent)
    assert [pool.refs(b) for b in parent.blocks] == [2, 2, 2]
    child_logits = forward(model, pool, cache, child, CASES[3]["prompt"][SHARED:])
    torch.testing.assert_close(
        child_logits, reference.cases[3]["prompt_logits"][-1], atol=ATOL, rtol=RTOL
    )
    assert child.blocks[:2] == parent.blocks[:2]  # full blocks: still shared
    assert child.blocks[2] != parent.blocks[2]  # the partly filled one: copied, then written
    parent_logits = forward(model, pool, cache, parent, PROMPT_A[SHARED:])
    torch.testing.assert_close(
        parent_logits, reference.cases[0]["prompt_logits"][-1], atol=ATOL, rtol=RTOL
    )
    pool.free(child)
    assert [pool.refs(b) for b in parent.blocks[:2]] == [1, 1]


def greedy(case: dict[str, Any]) -> Sampling:
    return Sampling(max_tokens=case["generate"], temperature=0.0, ignore_eos=True)


def run_all(runner: NativeRunner) -> tuple[dict[str, list[int]], int, int]:
    """Step until done: (tokens by sequence, steps that mixed prefill and decode, preemptions)."""
    out: dict[str, list[int]] = {}
    mixed = preempted = 0
    while runner.has_work:
        result = runner.step()
        mixed += bool(result.prefill_tokens and result.decode_tokens)
        preempted += len(result.preempted)
        for emitted in result.emitted:
            out.setdefault(emitted.seq_id, []).append(emitted.token)
    return out, mixed, preempted


def test_continuous_batching_generates_what_transformers_does(reference: Reference) -> None:
    config = RunnerConfig(block_size=8, num_blocks=64, max_num_seqs=4, max_batched_tokens=24)
    runner = NativeRunner(load_checkpoint(reference.path), config)
    for i, case in enumerate(CASES):
        runner.add(f"s{i}", case["prompt"], greedy(case))
    out, mixed, preempted = run_all(runner)
    assert mixed > 0  # prompt chunks ran beside decodes
    assert preempted == 0
    assert out == {f"s{i}": ref["tokens"] for i, ref in enumerate(reference.cases)}
    assert runner.pool.free_blocks == config.num_blocks


def test_preempted_sequences_are_recomputed_to_the_same_tokens(reference: Reference) -> None:
    config = RunnerConfig(block_size=8, num_blocks=14, max_num_seqs=4, max_batched_tokens=96)
    runner = NativeRunner(load_checkpoint(reference.path), config)
    for i, case in enumerate(CASES):
        runner.add(f"s{i}", case["prompt"], greedy(case))
    out, _, preempted = run_all(runner)
    assert preempted > 0
    assert out == {f"s{i}": ref["tokens"] for i, ref in enumerate(reference.cases)}
    assert runner.pool.free_blocks == config.num_blocks


def test_a_seeded_request_draws_the_same_tokens_in_any_batch(reference: Reference) -> None:
    sampling = Sampling(max_tokens=10, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    checkpoint = load_checkpoint(reference.path)
    alone = NativeRunner(checkpoint)
    alone.add("x", PROMPT_A, sampling)
    crowd = NativeRunner(checkpoint)
    for i, case in enumerate(CASES[1:]):
        crowd.add(f"other{i}", case["prompt"], Sampling(max_tokens=5, seed=i))
    crowd.add("x", PROMPT_A, sampling)
    other_seed = NativeRunner(checkpoint)
    other_seed.add("x", PROMPT_A, Sampling(max_tokens=10, temperature=0.8, seed=8, ignore_eos=True))
    tokens = run_all(alone)[0]["x"]
    assert run_all(crowd)[0]["x"] == tokens
    assert run_all(other_seed)[0]["x"] != tokens


def test_forks_attending_to_their_prefix_once_match_transformers(reference: Reference) -> None:
    model, pool, cache = setup(reference)
    parent = BlockTable()
    forward(model, pool, cache, parent, PROMPT_A[:SHARED])
    pieces, tails = [], [CASES[0]["prompt"][SHARED:], CASES[3]["prompt"][SHARED:]]
    for tail in tails:
        child = pool.fork(parent)
        pool.grow(child, len(tail), cache)
        end = SHARED + len(tail)
        context = pool.slots(child, 0, end)
        slots = pool.slots(child, SHARED, len(tail))
        pieces.append(Piece(tail, SHARED, slots, context, True, prefix_group=0, prefix_tokens=16))
    logits = model.forward(pieces, cache)
    for row, case in enumerate((0, 3)):
        expected = reference.cases[case]["prompt_logits"][-1]
        torch.testing.assert_close(logits[row], expected, atol=ATOL, rtol=RTOL)


def test_forked_sequences_generate_what_unforked_ones_do(reference: Reference) -> None:
    """A parent and four forks decoding together (their prefix read once) against the same
    requests sent apart without forks or sharing (checked against transformers above)."""
    samplings = [
        Sampling(max_tokens=6, temperature=0.0, ignore_eos=True),
        Sampling(max_tokens=6, temperature=0.0, ignore_eos=True),
        Sampling(max_tokens=6, temperature=1.0, seed=1, ignore_eos=True),
        Sampling(max_tokens=6, temperature=1.0, seed=2, ignore_eos=True),
    ]
    checkpoint = load_checkpoint(reference.path)
    forked = NativeRunner(checkpoint, RunnerConfig(block_size=8))
    forked.add("parent", PROMPT_A, Sampling(max_tokens=8, temperature=0.0, ignore_eos=True))
    first = forked.step().emitted[0].token
    for i, sampling in enumerate(samplings):
        forked.fork("parent", f"child{i}", sampling)
    saved = 0
    out: dict[str, list[int]] = {"parent": [first]}
    while forked.has_work:
        result = forked.step()
        saved += result.shared_prefix_reads_saved
        for emitted in result.emitted:
            out.setdefault(emitted.seq_id, []).append(emitted.token)
    assert saved > 0
    apart = NativeRunner(checkpoint, RunnerConfig(block_size=8, shared_prefix=False))
    apart.add("parent", PROMPT_A, Sampling(max_tokens=8, temperature=0.0, ignore_eos=True))
    for i, sampling in enumerate(samplings):
        apart.add(f"child{i}", [*PROMPT_A, first], sampling)
    assert run_all(apart)[0] == out
