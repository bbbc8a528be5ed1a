"""The work that passes a queued request (qlm/estimator/passing.py): its start moves back by
the more urgent arrivals' work until they stop being due first, as a step-by-step account
of the pool's time gives, and never for arrivals as urgent as itself."""

from __future__ import annotations

import random

import pytest

from qlm.estimator.passing import PassingRates, start_with_passing


def stepped_start_s(start_s: float, now_s: float, deadline_s: float, rates: PassingRates) -> float:
    """The same start by walking the pool's time in small steps: the work ahead of the
    request shrinks by one second a second and grows by the passing arrivals' work (within
    the rates' horizon)."""
    step_s = 1e-3
    if rates.below(deadline_s - now_s) >= 1.0:  # overloaded: the schedule's start
        return start_s
    at_s, ahead_s = now_s, start_s - now_s
    while ahead_s > 0:
        passing = rates.below(deadline_s - at_s) if at_s < now_s + rates.horizon_s else 0.0
        ahead_s += (passing - 1.0) * step_s
        at_s += step_s
    return at_s


def test_one_urgent_stream_stretches_the_wait_as_a_priority_queue() -> None:
    # Interactive requests (10 s budget) bring 0.6 pool-seconds of work a second; a batch
    # request due in 600 s, 20 s of work ahead of it now, starts after 20 / (1 - 0.6) s.
    rates = PassingRates.of([(10.0, 0.6)] * 60, window_s=60.0)
    assert rates.below(600.0) == pytest.approx(0.6)
    assert start_with_passing(120.0, 100.0, 700.0, rates) == pytest.approx(150.0)


def test_arrivals_as_urgent_or_less_never_pass() -> None:
    rates = PassingRates.of([(10.0, 30.0), (600.0, 30.0)], window_s=60.0)
    # Its own class (budget 10 s; deadline less arrival off in the last bits) and the
    # slower one are due after it: the schedule's start stands.
    assert start_with_passing(105.0, 100.0, 110.0 + 1e-9, rates) == 105.0
    assert start_with_passing(105.0, 100.0, 110.0 - 1e-9, rates) == 105.0
    assert start_with_passing(90.0, 100.0, 700.0, rates) == 100.0  # starts now


def test_passing_stops_once_arrivals_are_due_after_it() -> None:
    # Urgent work takes 0.9 of the pool: by 10 s before the request's deadline, when
    # arrivals stop being due first, 4 s of its 8 s ahead are done (0.1 x 40 s); the
    # other 4 s follow at full speed.
    rates = PassingRates.of([(10.0, 54.0)], window_s=60.0)
    want_s = 140.0 + 4.0
    assert start_with_passing(108.0, 100.0, 150.0, rates) == pytest.approx(want_s, abs=0.01)


def test_an_overloaded_pool_keeps_the_schedules_start() -> None:
    # Urgent work alone at 1.5x the pool: the schedule sheds by cost, not by deadline, so
    # nothing says this request is the one passed; the forecast is the schedule's.
    rates = PassingRates.of([(10.0, 90.0)], window_s=60.0)
    assert start_with_passing(105.0, 100.0, 150.0, rates) == 105.0


@pytest.mark.parametrize("seed", range(20))
def test_the_closed_form_matches_a_stepped_account(seed: int) -> None:
    rng = random.Random(seed)
    budgets = [rng.choice((1.0, 5.0, 10.0, 30.0, 60.0, 600.0)) for _ in range(rng.randint(1, 40))]
    arrivals = [(b, rng.uniform(0.0, 4.0)) for b in budgets]
    rates = PassingRates.of(arrivals, window_s=60.0)
    now_s = 50.0
    start_s = now_s + rng.uniform(0.0, 30.0)
    deadline_s = now_s + rng.uniform(1.0, 200.0)
    want = stepped_start_s(start_s, now_s, deadline_s, rates)
    assert start_with_passing(start_s, now_s, deadline_s, rates) == pytest.approx(want, abs=0.05)


def test_no_deadline_and_no_arrivals_leave_the_start() -> None:
    rates = PassingRates.of([(10.0, 30.0), (float("inf"), 99.0)], window_s=60.0)
    assert rates.budgets_s == (10.0,)  # requests without a deadline never pass
    assert start_with_passing(120.0, 100.0, float("inf"), rates) == 120.0
    assert start_with_passing(120.0, 100.0, 700.0, PassingRates.of([], 60.0)) == 120.0
    with pytest.raises(ValueError, match="window_s"):
        PassingRates.of([], window_s=0.0)


def test_rates_hold_only_as_far_ahead_as_they_were_measured() -> None:
    # Urgent work at 0.9 of the pool over the window measured (60 s): a request due in an
    # hour, 30 s of work ahead of it, is passed by that minute's 54 s of work, not by an
    # hour of it: 6 s of its 30 done in the minute, 24 s after.
    rates = PassingRates.of([(10.0, 54.0)], window_s=60.0)
    assert rates.horizon_s == 60.0
    assert start_with_passing(130.0, 100.0, 3700.0, rates) == pytest.approx(160.0 + 24.0)
