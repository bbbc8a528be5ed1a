"""The bound of a wait forecast (qlm/estimator/forecast_band.py) holds for the share it promises
whatever the errors' distribution, additive or proportional, gives nothing before it has
enough of them, scales with the forecast, keeps classes apart, follows a change of load within
its window, keeps its promise while the errors drift (the adaptive level), and grades a bound
that passed with no first token as a miss at once."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from qlm.estimator.forecast_band import ForecastBand

Draw = Callable[[random.Random], float]
SHAPES: dict[str, Draw] = {
    "normal": lambda rng: rng.gauss(0.0, 2.0),
    "exponential (always late)": lambda rng: rng.expovariate(0.2),
    "lognormal (heavy tail)": lambda rng: rng.lognormvariate(0.0, 1.5) - 1.0,
    "mostly early": lambda rng: -abs(rng.gauss(3.0, 1.0)) + (rng.random() < 0.15) * 20.0,
}
# Errors that grow with the wait (a backlog ahead): actual = forecast x factor.
FACTORS: dict[str, Draw] = {
    "lognormal factor": lambda rng: rng.lognormvariate(0.3, 0.5),
    "twice as late, sometimes": lambda rng: 1.0 + (rng.random() < 0.3) * rng.uniform(0.5, 1.5),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_bound_holds_nine_times_in_ten_whatever_the_residuals(shape: str) -> None:
    rng = random.Random(7)
    draw = SHAPES[shape]
    band = ForecastBand(quantile=0.9, window=200)
    held = total = 0
    for step in range(6000):
        forecast_s = rng.uniform(0.0, 30.0)
        actual_s = max(0.0, forecast_s + draw(rng))
        upper_s = band.upper_s("batch", forecast_s)
        if step >= 200:  # a full window behind it
            assert upper_s is not None
            held += actual_s <= upper_s
            total += 1
        band.observe("batch", forecast_s, actual_s)
    assert 0.87 <= held / total <= 0.94, (shape, held / total)


@pytest.mark.parametrize("shape", list(FACTORS))
def test_the_bound_holds_when_errors_grow_with_the_wait(shape: str) -> None:
    rng = random.Random(11)
    band = ForecastBand(quantile=0.9, window=200)
    held = total = 0
    for step in range(6000):
        forecast_s = rng.uniform(0.5, 120.0)
        actual_s = forecast_s * FACTORS[shape](rng)
        upper_s = band.upper_s("batch", forecast_s)
        if step >= 200:
            assert upper_s is not None
            held += actual_s <= upper_s
            total += 1
        band.observe("batch", forecast_s, actual_s)
    assert 0.87 <= held / total <= 0.94, (shape, held / total)


def test_no_bound_before_the_quantile_has_enough_residuals() -> None:
    band = ForecastBand(quantile=0.9)
    for k in range(8):
        band.observe("interactive", 1.0, 1.0 + k)
        assert band.upper_s("interactive", 2.0) is None  # ceil(0.9 (n + 1)) > n for n < 9
    band.observe("interactive", 1.0, 9.0)
    # the largest of 9 scores: 9 times later (at the 10 ms floor) than forecast
    assert band.upper_s("interactive", 2.0) == pytest.approx(2.01 * 9.01 / 1.01 - 0.01)
    assert band.upper_s("interactive", None) is None  # a predicted miss has no bound


def test_classes_are_kept_apart_and_a_bound_never_goes_below_zero() -> None:
    band = ForecastBand(quantile=0.5, window=10)
    for _ in range(10):
        band.observe("interactive", 5.0, 1.0)  # forecasts 4 s late
        band.observe("batch", 5.0, 65.0)  # a minute early
    assert band.upper_s("interactive", 5.0) == pytest.approx(1.0)
    assert band.upper_s("interactive", 2.0) == pytest.approx(2.01 * 1.01 / 5.01 - 0.01)
    assert band.upper_s("interactive", 0.0) == 0.0
    assert band.upper_s("batch", 5.0) == pytest.approx(65.0)
    assert band.upper_s("batch", 10.0) == pytest.approx(10.01 * 65.01 / 5.01 - 0.01)
    assert band.upper_s("batch-2", 5.0) is None


def test_the_window_follows_a_change_of_load() -> None:
    band = ForecastBand(quantile=0.9, window=50)
    for _ in range(50):
        band.observe("batch", 10.0, 11.0)
    assert band.upper_s("batch", 10.0) == pytest.approx(11.0)
    for _ in range(50):  # a burst: forecasts now a minute short
        band.observe("batch", 10.0, 70.0)
    assert band.upper_s("batch", 10.0) == pytest.approx(70.0)
    assert band.observed("batch") == 50


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="quantile"):
        ForecastBand(quantile=1.0)
    with pytest.raises(ValueError, match="window"):
        ForecastBand(window=0)
    with pytest.raises(ValueError, match="step"):
        ForecastBand(step=1.0)


def _drifting_run(step: float) -> float:
    """Share of bounds held over a run whose forecasts grow steadily too short (a backlog
    building faster than the forecasts see), graded at each request's first token."""
    rng = random.Random(3)
    band = ForecastBand(quantile=0.9, window=200, step=step)
    held = total = 0
    for k in range(6000):
        forecast_s = rng.uniform(1.0, 20.0)
        drift = math.exp(k / 1000)  # each window of 200 about 22 % later than the last
        actual_s = forecast_s * drift * rng.lognormvariate(0.0, 0.1)
        upper_s = band.upper_s("interactive", forecast_s)
        if upper_s is not None:
            held += actual_s <= upper_s
            total += 1
        band.observe("interactive", forecast_s, actual_s, upper_s)
    return held / total


def test_the_adaptive_level_keeps_the_promise_while_the_errors_drift() -> None:
    fixed = _drifting_run(step=0.0)  # split conformal at a fixed 0.9
    adaptive = _drifting_run(step=0.005)
    assert fixed < 0.75, fixed  # a window of old scores lags the drift
    assert adaptive >= 0.88, adaptive


def test_a_miss_raises_the_level_and_a_hold_lowers_it() -> None:
    band = ForecastBand(quantile=0.9, step=0.01)
    for _ in range(20):
        band.observe("batch", 10.0, 10.0)
    assert band.level("batch") == pytest.approx(0.9)  # no bound given: nothing graded
    band.observe("batch", 10.0, 30.0, upper_s=20.0)
    assert band.level("batch") == pytest.approx(0.9 + 0.01 * 0.9)
    band.observe("batch", 10.0, 10.0, upper_s=20.0)
    assert band.level("batch") == pytest.approx(0.9 + 0.01 * 0.9 - 0.01 * 0.1)
    assert band.level("interactive") == pytest.approx(0.9)


def test_a_bound_that_passes_with_no_first_token_is_a_miss_at_once_and_only_once() -> None:
    band = ForecastBand(quantile=0.9, step=0.01)
    for _ in range(20):
        band.observe("batch", 10.0, 10.0)
    upper_s = band.bound("r1", "batch", arrival_at_s=100.0, forecast_s=10.0)
    assert upper_s == pytest.approx(10.0)
    assert band.given("r1") == upper_s
    band.expire(now_s=109.0)  # its bound has not passed yet
    assert band.level("batch") == pytest.approx(0.9)
    band.expire(now_s=111.0)  # passed, no first token: a miss, known now
    assert band.level("batch") == pytest.approx(0.909)
    band.expire(now_s=200.0)
    assert band.level("batch") == pytest.approx(0.909)  # graded once
    band.first_token("r1", first_token_at_s=150.0)  # its score counts, not a second miss
    assert band.level("batch") == pytest.approx(0.909)
    assert band.observed("batch") == 21
    assert band.awaited() == []


def test_a_first_token_within_the_bound_is_a_hold_and_forgotten_ids_grade_nothing() -> None:
    band = ForecastBand(quantile=0.9, step=0.01)
    for _ in range(20):
        band.observe("batch", 10.0, 10.0)
    band.bound("r1", "batch", arrival_at_s=0.0, forecast_s=10.0)
    band.bound("r2", "batch", arrival_at_s=0.0, forecast_s=10.0)
    band.first_token("r1", first_token_at_s=5.0)
    assert band.level("batch") == pytest.approx(0.899)
    band.forget("r2")  # refused after its forecast: never graded
    band.expire(now_s=1000.0)
    assert band.level("batch") == pytest.approx(0.899)
    band.first_token("unknown", first_token_at_s=1.0)
    assert band.observed("batch") == 21


def test_awaited_forecasts_are_listed_oldest_first_and_capped_per_class() -> None:
    band = ForecastBand(awaited_per_class=3)
    for k in range(5):
        band.bound(f"b{k}", "batch", arrival_at_s=float(k), forecast_s=1.0)
    band.bound("i0", "interactive", arrival_at_s=0.0, forecast_s=1.0)
    assert band.awaited() == [("batch", "b2"), ("batch", "b3"), ("batch", "b4"),
                              ("interactive", "i0")]  # fmt: skip
    assert band.awaited(per_class=1) == [("batch", "b2"), ("interactive", "i0")]


def test_bound_times_of_ended_forecasts_do_not_pile_up_and_misses_still_grade() -> None:
    band = ForecastBand(quantile=0.9, step=0.01)
    for _ in range(20):
        band.observe("batch-2", 10.0, 10.0)
    for k in range(5000):  # long bounds, each request's first token soon after its forecast
        band.bound(f"r{k}", "batch-2", arrival_at_s=float(k), forecast_s=3600.0)
        band.first_token(f"r{k}", first_token_at_s=k + 1.0)
    assert len(band._due) <= 2 * len(band.awaited()) + 1024
    band.bound("late", "batch-2", arrival_at_s=6000.0, forecast_s=10.0)
    level = band.level("batch-2")
    band.expire(now_s=7000.0)  # its bound passed with no first token: still graded a miss
    assert band.level("batch-2") == pytest.approx(level + 0.01 * 0.9)
