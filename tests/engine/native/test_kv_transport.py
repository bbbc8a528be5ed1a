"""The prefill/decode split between processes (qlm/engine/native/kv_transport.py): the
message carries a hand-off whole; a prefill process and a decode process (spawned) connected
by a socket generate what one runner does; a refusal over the link puts the sequence back on
the prefill side."""

from __future__ import annotations

import io
import multiprocessing
import os
import threading
from multiprocessing.connection import Pipe
from typing import Any

import pytest
import torch

from qlm.engine.native.blocks import OutOfBlocksError
from qlm.engine.native.kv_handoff import KvHandoff, PrefillSide, hand_off
from qlm.engine.native.kv_transport import accept, from_message, offer, to_message
from qlm.engine.native.runner_config import RunnerConfig
from qlm.engine.native.step_runner import NativeRunner
from tests.engine.native.helpers import random_checkpoint
from tests.engine.native.pd_helpers import (
    FIRST_WAVE,
    SECOND_WAVE,
    decode_process,
    first_tokens,
    one_runner,
    prefill_process,
)

torch.set_num_threads(1)
KV_BYTES_PER_TOKEN = 2 * 1 * 1 * 16 * 4  # K and V, 1 layer, 1 KV head of 16 floats of 4 bytes


def prefill_side() -> PrefillSide:
    config = RunnerConfig(block_size=8, num_blocks=32, max_batched_tokens=64)
    return PrefillSide(NativeRunner(random_checkpoint(), config))


def test_a_message_carries_the_whole_hand_off() -> None:
    prefill = prefill_side()
    first_tokens(prefill, {"seeded": SECOND_WAVE["seeded"]})
    handoff = prefill.export("seeded")
    message = to_message(handoff)
    back = from_message(message)
    assert isinstance(back, KvHandoff)
    assert (back.seq_id, back.prompt_ids, back.output_ids, back.sampling) == (
        handoff.seq_id,
        handoff.prompt_ids,
        handoff.output_ids,
        handoff.sampling,
    )
    for name in ("k_layer_token_head_dim", "v_layer_token_head_dim", "generator_state"):
        assert torch.equal(getattr(back, name), getattr(handoff, name))
    assert handoff.kv_bytes == 19 * KV_BYTES_PER_TOKEN
    assert handoff.kv_bytes < len(message) < handoff.kv_bytes + 8192  # zip and names
    other = io.BytesIO()
    torch.save({"format": 2}, other)
    with pytest.raises(ValueError, match="not a hand-off message of format 1"):
        from_message(other.getvalue())


def test_a_refusal_over_the_link_puts_the_sequence_back() -> None:
    """The decode side (4 blocks of 16, two held) cannot take the 45-token prompt (3 blocks):
    `offer` raises its OutOfBlocksError and the sequence is running on the prefill side with
    its blocks; one that fits lands and its blocks here are freed."""
    prefill = prefill_side()
    config = RunnerConfig(block_size=16, num_blocks=4, max_num_seqs=4, max_batched_tokens=16)
    decode = NativeRunner(random_checkpoint(), config)
    first_tokens(prefill, FIRST_WAVE)
    hand_off(prefill, decode, "short")
    here, there = Pipe()
    errors: list[BaseException] = []

    def decode_side() -> None:
        for _ in range(2):
            try:
                accept(decode, there)
            except OutOfBlocksError as exc:
                errors.append(exc)

    thread = threading.Thread(target=decode_side)
    thread.start()
    assert offer(prefill, "mid", here) > 13 * KV_BYTES_PER_TOKEN
    free = prefill.runner.pool.free_blocks
    with pytest.raises(OutOfBlocksError, match="long needs 3 KV blocks for its 45 tokens"):
        offer(prefill, "long", here)
    thread.join(timeout=30)
    assert len(errors) == 1
    assert not prefill.in_flight
    assert [s.seq_id for s in prefill.runner.running] == ["long"]
    assert prefill.runner.pool.free_blocks == free
    assert prefill.runner.seq("long").computed == 45
    assert [s.seq_id for s in decode.running] == ["short", "mid"]
    assert decode.pool.free_blocks == 2


def test_a_prefill_process_and_a_decode_process_generate_what_one_engine_does() -> None:
    """Six requests prefilled one after another in a spawned prefill process, each offered
    over a local TCP socket to a spawned decode process decoding those it already took."""
    requests = FIRST_WAVE | SECOND_WAVE
    expected = one_runner(requests)
    ctx = multiprocessing.get_context("spawn")
    addresses: Any = ctx.Queue()
    results: Any = ctx.Queue()
    authkey = os.urandom(16)
    decoder = ctx.Process(target=decode_process, args=(addresses, results, 6, authkey))
    processes = [decoder]
    decoder.start()
    try:
        address = addresses.get(timeout=120)
        prefiller = ctx.Process(target=prefill_process, args=(address, results, requests, authkey))
        processes.append(prefiller)
        prefiller.start()
        got = {kind: rest for kind, *rest in (results.get(timeout=120) for _ in range(2))}
        for process in processes:
            process.join(timeout=30)
            assert process.exitcode == 0
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
    firsts, sent, prefill_free = got["prefill"]
    decoded, decode_free = got["decode"]
    assert {s: [firsts[s], *decoded[s]] for s in requests} == expected
    assert prefill_free == 32
    assert decode_free == 16
    for seq_id, (tokens, _) in requests.items():
        kv_bytes = len(tokens) * KV_BYTES_PER_TOKEN
        assert kv_bytes < sent[seq_id] < kv_bytes + 8192
