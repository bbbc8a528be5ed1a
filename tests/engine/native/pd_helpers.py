"""Shared by the prefill/decode split's tests (test_kv_handoff.py, test_kv_transport.py):
the requests, what one runner generates for them, and the two processes of the split (run
with multiprocessing's spawn: module-level functions)."""

from __future__ import annotations

from multiprocessing.connection import Client, Listener
from multiprocessing.queues import Queue
from typing import Any

import torch

from qlm.engine.native.kv_handoff import PrefillSide
from qlm.engine.native.kv_transport import accept, offer
from qlm.engine.native.paged_sequence import Sampling
from qlm.engine.native.runner_config import RunnerConfig
from qlm.engine.native.step_runner import NativeRunner
from tests.engine.native.helpers import random_checkpoint

GREEDY = Sampling(max_tokens=8, temperature=0.0, ignore_eos=True)
SEEDED = Sampling(max_tokens=8, temperature=0.9, top_p=0.95, seed=11, ignore_eos=True)
Requests = dict[str, tuple[list[int], Sampling]]


def prompt(length: int, salt: int) -> list[int]:
    return [(7 * i + salt) % 64 for i in range(length)]


# Prefill blocks of 8: lengths 5 (under a block), 13, 22 and 45 (six blocks), none a multiple.
FIRST_WAVE: Requests = {
    "short": (prompt(5, 1), GREEDY),
    "mid": (prompt(13, 2), GREEDY),
    "long": (prompt(45, 3), GREEDY),
}
SECOND_WAVE: Requests = {
    "odd": (prompt(22, 4), GREEDY),
    "seeded": (prompt(19, 5), SEEDED),
    "late": (prompt(9, 6), GREEDY),
}


def one_runner(requests: Requests) -> dict[str, list[int]]:
    """What a single runner generates for `requests`, all sent at once."""
    runner = NativeRunner(random_checkpoint(), RunnerConfig(block_size=8))
    for seq_id, (tokens, sampling) in requests.items():
        runner.add(seq_id, tokens, sampling)
    out: dict[str, list[int]] = {}
    while runner.has_work:
        for emitted in runner.step().emitted:
            out.setdefault(emitted.seq_id, []).append(emitted.token)
    return out


def first_tokens(prefill: PrefillSide, requests: Requests) -> dict[str, int]:
    """Prefill `requests` on the prefill side until each sampled its first token (kept
    running there, not yet handed off)."""
    for seq_id, (tokens, sampling) in requests.items():
        prefill.runner.add(seq_id, tokens, sampling)
    firsts: dict[str, int] = {}
    while len(firsts) < len(requests):
        for emitted in prefill.runner.step().emitted:
            assert emitted.seq_id not in firsts  # exported before it decodes here
            firsts[emitted.seq_id] = emitted.token
    return firsts


def decode_process(
    addresses: Queue[Any], results: Queue[Any], expected: int, authkey: bytes
) -> None:
    """The decode process: listens on a local port (sent back on `addresses`), takes
    `expected` hand-offs while decoding those it holds, and puts what it generated on
    `results`."""
    torch.set_num_threads(1)
    config = RunnerConfig(block_size=16, num_blocks=16, max_num_seqs=4, max_batched_tokens=16)
    runner = NativeRunner(random_checkpoint(), config)
    out: dict[str, list[int]] = {}
    with Listener(("127.0.0.1", 0), authkey=authkey) as listener:
        addresses.put(listener.address)
        with listener.accept() as conn:
            while len(out) < expected or runner.has_work:
                if len(out) < expected and (not runner.has_work or conn.poll()):
                    out[accept(runner, conn).seq_id] = []
                    continue
                for emitted in runner.step().emitted:
                    out[emitted.seq_id].append(emitted.token)
    results.put(("decode", out, runner.pool.free_blocks))


def prefill_process(
    address: tuple[str, int], results: Queue[Any], requests: Requests, authkey: bytes
) -> None:
    """The prefill process: prefills each request in turn and offers it to the decode
    process at `address`; puts the first tokens, the bytes sent per request and its free
    blocks on `results`."""
    torch.set_num_threads(1)
    config = RunnerConfig(block_size=8, num_blocks=32, max_batched_tokens=64)
    prefill = PrefillSide(NativeRunner(random_checkpoint(), config))
    firsts: dict[str, int] = {}
    sent: dict[str, int] = {}
    with Client(address, authkey=authkey) as conn:
        for seq_id, request in requests.items():
            firsts |= first_tokens(prefill, {seq_id: request})
            sent[seq_id] = offer(prefill, seq_id, conn)
    results.put(("prefill", firsts, sent, prefill.runner.pool.free_blocks))
