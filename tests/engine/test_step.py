"""The linear step-time model, runs of decode steps, and Profile's use of them."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qlm.perf.step import DecodeRun, StepTime
from tests.factories import make_profile

STEP = StepTime(
    base_s=0.01, per_prefill_token_s=1e-4, per_decode_seq_s=1e-3, per_context_token_s=1e-6
)


def test_iteration_time_is_the_linear_formula() -> None:
    # 10 ms + 500 x 0.1 ms + 8 x 1 ms + 4000 x 1 us = 10 + 50 + 8 + 4 = 72 ms
    assert STEP.iteration_s(500, 8, 4000) == pytest.approx(0.072)


def test_decode_table_is_the_model_at_a_typical_context() -> None:
    # batch b at 1000 tokens each: 10 ms + b x (1 ms + 1000 x 1 us) = 10 + 2b ms
    assert STEP.decode_table((1, 16, 64), 1000) == pytest.approx((0.012, 0.042, 0.138))


def test_marginal_prefill_rate() -> None:
    assert STEP.prefill_tokens_per_s == pytest.approx(1 / (1e-4 + 1e-6))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_s": 0.0},
        {"per_prefill_token_s": 0.0},
        {"per_decode_seq_s": -1e-3},
        {"per_context_token_s": math.nan},
    ],
)
def test_invalid_coefficients_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="step_time"):
        replace(STEP, **kwargs)


@given(
    first=st.floats(1e-4, 1.0),
    growth=st.floats(0.0, 1e-2),
    steps=st.integers(0, 5000),
)
def test_run_duration_is_the_sum_of_its_steps(first: float, growth: float, steps: int) -> None:
    run = DecodeRun(first, growth)
    assert run.duration_s(steps) == pytest.approx(
        math.fsum(run.step_s(k) for k in range(steps)), rel=1e-9, abs=1e-12
    )


@given(
    first=st.floats(1e-4, 1.0),
    growth=st.floats(0.0, 1e-2),
    elapsed=st.floats(0.0, 1e4),
    max_steps=st.integers(0, 10**6),
)
def test_steps_done_by_inverts_the_duration(
    first: float, growth: float, elapsed: float, max_steps: int
) -> None:
    run = DecodeRun(first, growth)
    k = run.steps_done_by(elapsed, max_steps)
    assert 0 <= k <= max_steps
    assert run.duration_s(k) <= elapsed + 1e-9
    if k < max_steps:
        assert run.duration_s(k + 1) > elapsed + 1e-9


def test_profile_uses_the_step_model_when_present() -> None:
    profile = replace(make_profile(), step_time=STEP)
    assert profile.iteration_s(500, 8, 4000) == pytest.approx(0.072)
    run = profile.decode_run(4, 2000)
    assert run.first_step_s == pytest.approx(0.01 + 0.004 + 0.002)
    assert run.growth_s == pytest.approx(4e-6)  # four more tokens of context per step


def test_profile_falls_back_to_its_table_and_prefill_rate() -> None:
    # factory table (1, 16, 64) -> (20, 25, 40) ms; 10k prefill tokens/s; context ignored
    profile = make_profile()
    assert profile.iteration_s(0, 16, 10**6) == pytest.approx(0.025)
    assert profile.iteration_s(500, 16, 0) == pytest.approx(0.025 + 0.05)
    assert profile.iteration_s(500, 0, 0) == pytest.approx(0.020 + 0.05)  # first row as base
    run = profile.decode_run(16, 8000)
    assert (run.first_step_s, run.growth_s) == (pytest.approx(0.025), 0.0)
