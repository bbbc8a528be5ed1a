"""The prefill/decode split in one process (qlm/engine/native/kv_handoff.py), on a tiny random
Llama: a prefill runner's first token followed by a decode runner's tokens equals one runner's
output, the prefill side's blocks are free once a sequence landed, and a refusal changes
nothing on either side."""

from __future__ import annotations

import pytest
import torch

from qlm.engine.native.blocks import OutOfBlocksError
from qlm.engine.native.kv_handoff import PrefillSide, hand_off
from qlm.engine.native.runner_config import RunnerConfig
from qlm.engine.native.step_runner import NativeRunner
from tests.engine.native.helpers import random_checkpoint
from tests.engine.native.pd_helpers import (
    FIRST_WAVE,
    GREEDY,
    SECOND_WAVE,
    first_tokens,
    one_runner,
    prompt,
)

torch.set_num_threads(1)


def prefill_runner(num_blocks: int = 32) -> PrefillSide:
    config = RunnerConfig(block_size=8, num_blocks=num_blocks, max_batched_tokens=64)
    return PrefillSide(NativeRunner(random_checkpoint(), config))


def test_prefill_then_decode_elsewhere_generates_what_one_runner_does() -> None:
    """The first wave is handed off to an idle decode runner (blocks of 16, another size than
    the prefill side's 8; three sequence slots, so one of six waits for a slot holding its
    blocks); after three decode steps the second wave lands beside them."""
    expected = one_runner(FIRST_WAVE | SECOND_WAVE)
    prefill = prefill_runner()
    config = RunnerConfig(block_size=16, num_blocks=16, max_num_seqs=3, max_batched_tokens=16)
    decode = NativeRunner(random_checkpoint(), config)
    out = {seq_id: [token] for seq_id, token in first_tokens(prefill, FIRST_WAVE).items()}
    for seq_id in FIRST_WAVE:
        hand_off(prefill, decode, seq_id)
    decode_steps = 0
    while decode.has_work:
        if decode_steps == 3:
            out |= {s: [t] for s, t in first_tokens(prefill, SECOND_WAVE).items()}
            assert len(decode.running) == 3  # decoding the first wave
            for seq_id in SECOND_WAVE:
                hand_off(prefill, decode, seq_id)
            assert len(decode.waiting) == 3  # no slot yet: waiting with their K and V
        result = decode.step()
        decode_steps += 1
        assert result.prefill_tokens == 0  # nothing is recomputed on the decode side
        for emitted in result.emitted:
            out[emitted.seq_id].append(emitted.token)
    assert out == expected
    assert decode.pool.free_blocks == 16


def test_the_prefill_sides_blocks_are_free_once_exported() -> None:
    prefill = prefill_runner(num_blocks=12)
    decode = NativeRunner(random_checkpoint(), RunnerConfig(block_size=8, num_blocks=12))
    first_tokens(prefill, FIRST_WAVE)
    pool = prefill.runner.pool
    assert pool.free_blocks == 12 - (1 + 2 + 6)
    held = {s: list(prefill.runner.seq(s).table.blocks) for s in FIRST_WAVE}
    handoff = hand_off(prefill, decode, "long")
    assert handoff.computed_tokens == 45
    assert handoff.kv_bytes == 45 * 128
    assert all(pool.refs(block) == 0 for block in held["long"])
    assert pool.free_blocks == 12 - (1 + 2)
    for seq_id in ("short", "mid"):
        hand_off(prefill, decode, seq_id)
    assert all(pool.refs(block) == 0 for block in range(12))
    assert pool.free_blocks == 12
    assert not prefill.runner.has_work
    assert not prefill.in_flight
    with pytest.raises(KeyError):
        prefill.runner.seq("long")
    assert decode.pool.free_blocks == 12 - (1 + 2 + 6)


def snapshot(runner: NativeRunner) -> tuple[object, ...]:
    return (
        [s.seq_id for s in runner.running],
        [s.seq_id for s in runner.waiting],
        [(s.seq_id, list(s.table.blocks), s.computed, list(s.tokens)) for s in runner.running],
        runner.pool.free_blocks,
        [runner.pool.refs(b) for b in range(runner.pool.num_blocks)],
        runner.cache.k.clone(),
        runner.cache.v.clone(),
    )


def assert_same(before: tuple[object, ...], after: tuple[object, ...]) -> None:
    *plain_before, k_before, v_before = before
    *plain_after, k_after, v_after = after
    assert plain_before == plain_after
    assert isinstance(k_before, torch.Tensor)
    assert isinstance(k_after, torch.Tensor)
    assert isinstance(v_before, torch.Tensor)
    assert isinstance(v_after, torch.Tensor)
    assert torch.equal(k_before, k_after)
    assert torch.equal(v_before, v_after)


def test_a_refusal_leaves_both_sides_as_they_were() -> None:
    """The decode side has 5 free blocks of 8 for the long prompt's 45 tokens (6 blocks):
    OutOfBlocksError, and neither side changed; the refused sequence then decodes on the
    prefill side and generates what one runner does. An id the decode side holds already is
    refused too (ValueError)."""
    expected = one_runner(FIRST_WAVE)
    prefill = prefill_runner()
    decode = NativeRunner(random_checkpoint(), RunnerConfig(block_size=8, num_blocks=7))
    out = {seq_id: [token] for seq_id, token in first_tokens(prefill, FIRST_WAVE).items()}
    hand_off(prefill, decode, "mid")  # 2 blocks of 7 taken
    prefill_before, decode_before = snapshot(prefill.runner), snapshot(decode)
    with pytest.raises(OutOfBlocksError, match=r"long needs 6 KV blocks .* 5 are free"):
        hand_off(prefill, decode, "long")
    assert_same(prefill_before, snapshot(prefill.runner))
    assert_same(decode_before, snapshot(decode))
    assert not prefill.in_flight
    prefill.runner.add("mid", prompt(3, 9), GREEDY)  # a new request reusing the moved id
    for _ in range(2):  # "short" and "long" decode beside it
        for emitted in prefill.runner.step().emitted:
            if emitted.seq_id != "mid":
                out[emitted.seq_id].append(emitted.token)
    assert len(prefill.runner.seq("mid").output) == 2
    decode_before = snapshot(decode)
    with pytest.raises(ValueError, match="sequence mid already exists"):
        hand_off(prefill, decode, "mid")
    assert_same(decode_before, snapshot(decode))
    prefill.runner.abort("mid")
    while prefill.runner.has_work or decode.has_work:
        for runner in (prefill.runner, decode):
            for emitted in runner.step().emitted:
                out[emitted.seq_id].append(emitted.token)
    assert out == expected


def test_only_a_sequence_that_just_sampled_is_exported() -> None:
    """A prompt still in prefill (chunks of 16 of 45 tokens) is not ready; an unknown id is
    not running; while in flight the prefill side neither decodes nor preempts it."""
    config = RunnerConfig(block_size=8, num_blocks=32, max_num_seqs=4, max_batched_tokens=16)
    prefill = PrefillSide(NativeRunner(random_checkpoint(), config))
    prefill.runner.add("long", prompt(45, 3), GREEDY)
    prefill.runner.step()
    with pytest.raises(ValueError, match="long has not just sampled a token"):
        prefill.export("long")
    with pytest.raises(ValueError, match="nope is not running on the prefill side"):
        prefill.export("nope")
    while not prefill.runner.seq("long").output:
        prefill.runner.step()
    handoff = prefill.export("long")
    assert handoff.output_ids == tuple(prefill.in_flight["long"].seq.output)
    assert not prefill.runner.has_work
    assert prefill.runner.step().emitted == ()
    prefill.refused("long")
    assert [e.seq_id for e in prefill.runner.step().emitted] == ["long"]
