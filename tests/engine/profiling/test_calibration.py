"""Fitting the step-time model: exact recovery on noiseless data, the Splitwise rows, R^2."""

from __future__ import annotations

import numpy as np
import pytest

from qlm.engine.profiling.calibration import StepSample, fit_step_time, r_squared, splitwise_samples
from qlm.perf.step import StepTime

TRUE = StepTime(
    base_s=0.03, per_prefill_token_s=2e-4, per_decode_seq_s=1e-4, per_context_token_s=5e-7
)


def test_fit_recovers_the_coefficients_of_noiseless_samples() -> None:
    shapes = [
        (512, 0, 512),
        (2048, 0, 2048),
        (0, 1, 600),
        (0, 16, 9000),
        (0, 64, 40000),
        (256, 8, 5000),
        (128, 0, 128),
    ]
    samples = [StepSample(p, d, c, TRUE.iteration_s(p, d, c)) for p, d, c in shapes]
    fit = fit_step_time(samples)
    got = fit.step_time
    assert got.base_s == pytest.approx(TRUE.base_s, rel=1e-6)
    assert got.per_prefill_token_s == pytest.approx(TRUE.per_prefill_token_s, rel=1e-6)
    assert got.per_decode_seq_s == pytest.approx(TRUE.per_decode_seq_s, rel=1e-6)
    assert got.per_context_token_s == pytest.approx(TRUE.per_context_token_s, rel=1e-6)
    assert fit.max_relative_error < 1e-6
    assert fit.samples == 7


def test_fit_needs_four_samples() -> None:
    with pytest.raises(ValueError, match="at least four"):
        fit_step_time([StepSample(1, 0, 1, 0.01)] * 3)


def _row(
    prompt: int, batch: int, token: int, prompt_ms: float, token_ms: float, tp: int = 4
) -> dict[str, str]:
    return {
        "model": "llama2-70b",
        "hardware": "a100-80gb",
        "tensor_parallel": str(tp),
        "prompt_size": str(prompt),
        "batch_size": str(batch),
        "token_size": str(token),
        "prompt_time": str(prompt_ms),
        "token_time": str(token_ms),
    }


def test_splitwise_rows_become_prefill_and_decode_samples() -> None:
    rows = [
        _row(512, 1, 128, 120.0, 44.0),
        _row(512, 1, 128, 130.0, 46.0),
        _row(512, 1, 128, 500.0, 45.0),  # median of three: 130 ms and 45 ms
        _row(512, 16, 128, 2900.0, 48.0),  # 8192 prefill tokens: beyond the chunk limit
        _row(512, 1, 128, 1.0, 1.0, tp=2),  # another tensor-parallel degree
    ]
    samples = splitwise_samples(rows, "llama2-70b", "a100-80gb", 4, max_prefill_tokens=4096)
    by_label = {s.label: s for s in samples}
    assert set(by_label) == {"prefill 1x512", "decode b=1 p=512 t=128", "decode b=16 p=512 t=128"}
    prefill = by_label["prefill 1x512"]
    assert (prefill.prefill_tokens, prefill.decode_seqs, prefill.context_tokens) == (512, 0, 512)
    assert prefill.iteration_s == pytest.approx(0.130)
    decode = by_label["decode b=16 p=512 t=128"]
    # 16 sequences holding 512 + 128/2 tokens on average over the generation
    assert (decode.decode_seqs, decode.context_tokens) == (16, 16 * 576)
    assert decode.iteration_s == pytest.approx(0.048)


def test_r_squared_is_the_share_of_variance_explained() -> None:
    assert r_squared([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0
    assert r_squared([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == 0.0
    assert r_squared([1.0, 2.0, 3.0], [1.5, 2.0, 2.5]) == pytest.approx(1 - 0.5 / 2.0)
    assert np.isnan(r_squared([2.0, 2.0], [1.0, 3.0]))
