"""From a profiling run to a profile file (qlm/engine/profiling/measured.py): the fit on
synthetic measurements, and the profile file it writes (which the simulator then reads)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from qlm.config.profile_files import load_profile, load_profile_file, write_profile_file
from qlm.engine.profiling.calibration import StepSample
from qlm.engine.profiling.measured import (
    ModelFacts,
    ProfileRun,
    ProfileTarget,
    build_profile_file,
    fit_profile,
    gpu_memory_utilization,
    merge_repeats,
)
from qlm.engine.profiling.probes import (
    LabeledSample,
    Probe,
    ProbeKind,
    ProfileGrid,
    SampleKind,
    batch_samples,
    prefill_sample,
)
from qlm.engine.vllm.metrics import KvFacts
from qlm.perf.profile import GIB
from qlm.perf.step import StepTime

TRUE = StepTime(
    base_s=2.5e-3, per_prefill_token_s=9e-5, per_decode_seq_s=2e-4, per_context_token_s=4e-7
)


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
