"""What a profiling run measures (qlm/engine/profiling/probes.py): the grid of probes and the
samples each probe's measured times give."""

from __future__ import annotations

import pytest

from qlm.engine.profiling.calibration import StepSample
from qlm.engine.profiling.probes import (
    EngineLimits,
    Probe,
    ProbeKind,
    ProfileGrid,
    SampleKind,
    batch_samples,
    prefill_sample,
)

LIMITS = EngineLimits(max_num_seqs=8, max_model_len=4096, max_num_batched_tokens=2048)

# --- the grid ----------------------------------------------------------------------------


def test_the_default_grid_covers_every_kind_and_repeats_round_by_round() -> None:
    grid = ProfileGrid()
    probes = grid.probes()
    per_round = len(probes) // grid.repeats
    assert {p.kind for p in probes} == set(ProbeKind)
    assert [p.repeat for p in probes] == [r for r in range(grid.repeats) for _ in range(per_round)]
    assert probes[:per_round] == tuple(
        Probe(p.kind, p.prefill_tokens, p.batch_size, p.context_tokens, p.decode_tokens, 0)
        for p in probes[per_round : 2 * per_round]
    )
    assert grid.problems(LIMITS) == []


def test_a_grid_that_does_not_fit_the_engine_says_why() -> None:
    grid = ProfileGrid(prefill_tokens=(16, 3000), batch_sizes=(1, 16))
    problems = grid.problems(LIMITS)
    assert any("prefill_tokens: 3000 > the token budget 2048" in p for p in problems)
    assert any("batch_sizes: 16 > max_num_seqs 8" in p for p in problems)
    small_kv = EngineLimits(8, 4096, 2048, kv_capacity_tokens=14_000)
    assert any("outlast the probe" in p for p in ProfileGrid().problems(small_kv))


def test_background_requests_run_as_long_as_context_and_kv_allow() -> None:
    grid = ProfileGrid()
    assert grid.background_tokens(LIMITS, 1536) == 4096 - 1536
    assert grid.background_tokens(LIMITS, 64) == 4096 - 64
    assert grid.background_tokens(EngineLimits(8, 4096, 2048, 16_000), 1536) == 2000 - 1536


def test_grid_sizes_are_validated_and_sorted() -> None:
    assert ProfileGrid(batch_sizes=(4, 1, 4)).batch_sizes == (1, 4)
    with pytest.raises(ValueError, match="each >= 1"):
        ProfileGrid(prefill_tokens=(0, 16))


# --- measured times -> samples ----------------------------------------------------------


def test_a_batch_probe_gives_its_prefill_beside_the_batch_and_its_mean_decode_step() -> None:
    probe = Probe(ProbeKind.BATCH, batch_size=4, context_tokens=100, decode_tokens=65)
    mixed, decode = batch_samples(probe, prefill_s=0.03, decode_s=0.64, background_tokens=7.5)
    assert mixed.kind is SampleKind.MIXED
    # the probe's 100 prompt tokens beside 3 sequences holding 100 + 7.5 tokens each
    assert (mixed.sample.prefill_tokens, mixed.sample.decode_seqs) == (100, 3)
    assert mixed.sample.context_tokens == pytest.approx(3 * 107.5 + 100)
    assert mixed.sample.iteration_s == 0.03
    # 64 decode steps of 4 sequences; over them the probe held 100 + 32 tokens on average
    # and the others 7.5 more each
    assert decode.kind is SampleKind.DECODE
    assert (decode.sample.prefill_tokens, decode.sample.decode_seqs) == (0, 4)
    assert decode.sample.context_tokens == pytest.approx(4 * 132.5 + 3 * 7.5)
    assert decode.sample.iteration_s == pytest.approx(0.01)


def test_a_batch_of_one_is_a_prefill_alone_and_a_lone_decode() -> None:
    probe = Probe(ProbeKind.BATCH, batch_size=1, context_tokens=64, decode_tokens=33)
    prefill, decode = batch_samples(probe, 0.01, 0.064, background_tokens=99)
    assert prefill.kind is SampleKind.PREFILL
    assert (prefill.sample.decode_seqs, prefill.sample.context_tokens) == (0, 64)
    assert (decode.sample.decode_seqs, decode.sample.context_tokens) == (1, 64 + 16.5)
    assert decode.sample.iteration_s == pytest.approx(0.002)


def test_prefill_samples_count_the_prompt_in_the_context() -> None:
    got = prefill_sample(Probe(ProbeKind.PREFILL, prefill_tokens=512), 0.05)
    assert got.kind is SampleKind.PREFILL
    assert got.sample == StepSample(512, 0, 512, 0.05, "prefill P=512 #0")
