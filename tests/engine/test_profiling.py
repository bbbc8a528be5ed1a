"""`qlm profile`'s pure part: the grid, measured times -> samples, the fit on synthetic
measurements, and the profile file it writes (which the simulator then reads)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from qlm.engine.calibration import StepSample, r_squared
from qlm.engine.library import load_profile, load_profile_file, write_profile_file
from qlm.engine.profiling import (
    DECODE_TIME,
    PREFILL_TIME,
    EngineLimits,
    HistogramTotal,
    KvFacts,
    LabeledSample,
    ModelFacts,
    Probe,
    ProbeKind,
    ProfileGrid,
    ProfileRun,
    ProfileTarget,
    SampleKind,
    batch_samples,
    build_profile_file,
    fit_profile,
    gpu_memory_utilization,
    histogram_delta,
    histogram_totals,
    kv_facts,
    merge_repeats,
    prefill_sample,
)
from qlm.perf.profile import GIB
from qlm.perf.step import StepTime

TRUE = StepTime(
    base_s=2.5e-3, per_prefill_token_s=9e-5, per_decode_seq_s=2e-4, per_context_token_s=4e-7
)
LIMITS = EngineLimits(max_num_seqs=8, max_model_len=4096, max_num_batched_tokens=2048)


def synthetic_samples(noise: float, seed: int = 0) -> list[LabeledSample]:
    """What the grid's probes would measure on an engine that follows TRUE, with
    multiplicative noise of this relative size."""
    rng = np.random.default_rng(seed)
    shapes: list[LabeledSample] = []
    for probe in ProfileGrid().probes():
        if probe.kind is ProbeKind.PREFILL:
            shapes.append(prefill_sample(probe, 1.0))
        else:
            shapes += batch_samples(probe, 1.0, 1.0, background_tokens=10)
    out = []
    for shape in shapes:
        s = shape.sample
        t = TRUE.iteration_s(s.prefill_tokens, s.decode_seqs, s.context_tokens)
        t *= 1.0 + noise * rng.standard_normal()
        sample = StepSample(s.prefill_tokens, s.decode_seqs, s.context_tokens, t, s.label)
        out.append(LabeledSample(shape.kind, sample))
    return out


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


METRICS_BEFORE = """\
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 2.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.5
# HELP vllm:request_decode_time_seconds Histogram of time spent in DECODE phase for request.
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_count{engine="0",model_name="m"} 10.0
vllm:request_decode_time_seconds_sum{engine="0",model_name="m"} 0.04
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",kv_cache_memory_bytes="67108864",num_gpu_blocks="512"} 1.0
"""


def test_histogram_deltas_isolate_one_probe() -> None:
    after_text = (
        METRICS_BEFORE.replace(
            '_count{engine="0",model_name="m"} 2.0', '_count{engine="0",model_name="m"} 3.0'
        )
        .replace('_sum{engine="0",model_name="m"} 0.5', '_sum{engine="0",model_name="m"} 0.625')
        .replace("} 10.0", "} 42.0")
        .replace("} 0.04", "} 0.2")
    )
    before, after = histogram_totals(METRICS_BEFORE), histogram_totals(after_text)
    assert before[PREFILL_TIME] == HistogramTotal(0.5, 2.0)
    prefill = histogram_delta(before, after, PREFILL_TIME)
    assert prefill.count == 1.0
    assert prefill.sum_s == pytest.approx(0.125)
    decode = histogram_delta(before, after, DECODE_TIME)
    assert decode.count == 32.0
    assert decode.sum_s == pytest.approx(0.16)


def test_kv_facts_come_from_cache_config_info() -> None:
    facts = kv_facts(METRICS_BEFORE)
    assert facts == KvFacts(capacity_tokens=511 * 128, bytes_per_token=1024, block_size=128)
    with pytest.raises(ValueError, match="cache_config_info"):
        kv_facts("# nothing here\n")


# --- the fit ----------------------------------------------------------------------------


def test_the_fit_recovers_the_engine_from_noiseless_probes() -> None:
    result = fit_profile(synthetic_samples(noise=0.0))
    got = result.fit.step_time
    assert got.base_s == pytest.approx(TRUE.base_s, rel=1e-6)
    assert got.per_prefill_token_s == pytest.approx(TRUE.per_prefill_token_s, rel=1e-6)
    assert got.per_decode_seq_s == pytest.approx(TRUE.per_decode_seq_s, rel=1e-6)
    assert got.per_context_token_s == pytest.approx(TRUE.per_context_token_s, rel=1e-6)
    quality = result.quality()
    assert quality.r_squared == pytest.approx(1.0)
    assert quality.max_relative_error < 1e-9
    assert set(result.quality_by_kind()) == {"prefill", "decode", "mixed"}


def test_with_noise_the_fit_stays_close_and_reports_its_error() -> None:
    result = fit_profile(synthetic_samples(noise=0.03, seed=4))
    got = result.fit.step_time
    assert got.base_s == pytest.approx(TRUE.base_s, rel=0.15)
    assert got.per_prefill_token_s == pytest.approx(TRUE.per_prefill_token_s, rel=0.1)
    assert got.per_decode_seq_s == pytest.approx(TRUE.per_decode_seq_s, rel=0.25)
    quality = result.quality()
    assert quality.r_squared is not None
    assert 0.97 < quality.r_squared < 1.0
    assert 0.03 < quality.max_relative_error < 0.2
    rows = result.rows()
    worst = max(abs(r.predicted_s / r.measured_s - 1) for r in rows)
    assert worst == pytest.approx(quality.max_relative_error)


def test_the_fit_takes_the_median_of_each_probes_repeats() -> None:
    probe = Probe(ProbeKind.BATCH, batch_size=2, context_tokens=100, decode_tokens=11)
    repeats = [
        batch_samples(replace(probe, repeat=r), prefill_s, decode_s, background_tokens=k0)
        for r, (prefill_s, decode_s, k0) in enumerate(
            [(0.010, 0.050, 4.0), (0.900, 0.040, 6.0), (0.012, 0.060, 8.0)]
        )
    ]
    merged = merge_repeats([s for pair in repeats for s in pair])
    assert [m.kind for m in merged] == [SampleKind.MIXED, SampleKind.DECODE]
    mixed, decode = merged
    assert mixed.sample.iteration_s == 0.012  # the spike (0.9 s) does not move the median
    assert mixed.sample.context_tokens == pytest.approx(1 * (100 + 6.0) + 100)
    assert decode.sample.iteration_s == pytest.approx(0.005)
    assert "median of 3" in decode.sample.label


def test_r_squared_is_the_share_of_variance_explained() -> None:
    assert r_squared([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0
    assert r_squared([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == 0.0
    assert r_squared([1.0, 2.0, 3.0], [1.5, 2.0, 2.5]) == pytest.approx(1 - 0.5 / 2.0)
    assert np.isnan(r_squared([2.0, 2.0], [1.0, 3.0]))


# --- the profile file -------------------------------------------------------------------

FACTS = ModelFacts(
    name="tiny-a",
    path="/models/tiny-a",
    weight_bytes=300_000,
    kv=KvFacts(capacity_tokens=65_408, bytes_per_token=1024, block_size=128),
    max_num_seqs=8,
)


def profile_run(samples: list[LabeledSample]) -> ProfileRun:
    return ProfileRun(
        facts=FACTS,
        grid=ProfileGrid(),
        samples=tuple(samples),
        load_s=(40.0, 30.0, 35.0),
        overhead_s=(0.004, 0.006, 0.005),
        engine="vllm 0.32.0",
        engine_settings={"max_num_seqs": 8, "max_num_batched_tokens": 2048},
        measured_at="2025-01-01T00:00:00+00:00",
        host="Linux x86_64, 2 CPUs",
        load_average=(1.0, 1.5, 2.0),
        wall_s=61.0,
        skipped=("batch b=2 C=64 #1",),
    )


def test_the_profile_file_round_trips_and_reproduces_the_engine(tmp_path: Path) -> None:
    samples = synthetic_samples(noise=0.0)
    fit = fit_profile(samples)
    target = ProfileTarget(
        gpu_type="cpu", gpu_memory_bytes=GIB, output_tokens_mean=120, output_tokens_std=60
    )
    spec = build_profile_file(profile_run(samples), fit, target)
    path = tmp_path / "tiny-a_cpu.yaml"
    write_profile_file(spec, path)

    again = load_profile_file(path)
    assert again == spec
    profile = load_profile(path)
    assert profile.key == ("tiny-a", "cpu")
    assert profile.step_time == fit.fit.step_time
    assert profile.load_s == 35.0  # the median load
    assert profile.max_batch_size == 8
    assert profile.kv_capacity_tokens(GIB) == FACTS.kv.capacity_tokens
    assert profile.output_tokens_mean == 120
    for shape in samples:
        s = shape.sample
        measured = s.iteration_s
        assert profile.iteration_s(s.prefill_tokens, s.decode_seqs, s.context_tokens) == (
            pytest.approx(measured, rel=1e-6)
        )
    assert spec.measurement is not None
    assert spec.measurement.request_overhead_s == pytest.approx(0.005)
    assert spec.measurement.skipped_probes == ("batch b=2 C=64 #1",)
    assert len(spec.measurement.iterations) == len(fit.samples) == len(samples) // 3
    assert spec.measurement.grid["batch_sizes"] == (1, 2, 4, 8)
    assert {r.kind for r in spec.measurement.iterations} == {"prefill", "decode", "mixed"}
    kinds = {name: src.kind for name, src in spec.provenance.fields.items()}
    assert kinds["step_time.base_s"] == "measured"
    assert kinds["load_s"] == "measured"
    assert kinds["output_tokens_mean"] == "assumed"
    assert kinds["gpu_memory_utilization"] == "derived"


def test_memory_too_small_for_the_measured_cache_is_an_error() -> None:
    assert gpu_memory_utilization(FACTS, GIB) == pytest.approx((300_000 + 65_408.5 * 1024) / GIB)
    with pytest.raises(ValueError, match="exceed the GPU memory"):
        gpu_memory_utilization(FACTS, 32 * 2**20)
