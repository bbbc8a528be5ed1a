"""The work that passes a queued request (qlm/estimator/passing.py): its start moves back by
the more urgent arrivals' work until they stop being due first, as a step-by-step account
of the pool's time gives, and never for arrivals as urgent as itself."""

from __future__ import annotations

import random

import pytest

from qlm.estimator.passing import PassingRates, start_with_passing


def stepped_start_s(start_s: float, now_s: float, deadline_s: float, rates: PassingRates) -> float:
    """The same start by walking the pool's time in small steps: the work ahead of the
    request shrinks by one second a second and grows by the passing arrivals' work."""
    step_s = 1e-3
    at_s, ahead_s = now_s, start_s - now_s
    while ahead_s > 0:
        ahead_s += (rates.below(deadline_s - at_s) - 1.0) * step_s
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
    # Urgent work fills the pool (rate 1.5): nothing of the request's is done until
    # arrivals stop being due first, 10 s before its deadline; then its 5 s ahead remain,
    # plus what the urgent stream added meanwhile (0.5 x 40 s).
    rates = PassingRates.of([(10.0, 90.0)], window_s=60.0)
    want_s = 140.0 + 5.0 + 20.0
    assert start_with_passing(105.0, 100.0, 150.0, rates) == pytest.approx(want_s, abs=0.01)


@pytest.mark.parametrize("seed", range(20))
def test_the_closed_form_matches_a_stepped_account(seed: int) -> None:
    rng = random.Random(seed)
    budgets = [rng.choice((1.0, 5.0, 10.0, 30.0, 60.0, 600.0)) for _ in range(rng.randint(1, 40))]
    arrivals = [(b, rng.uniform(0.0, 4.0)) for b in budgets]
    rates = PassingRates.of(arrivals, window_s=60.0)
    now_s = 50.0
    start_s = now_s + rng.uniform(0.0, 30.0)
    deadline_s = now_s + rng.uniform(1.0, 120.0)
    want = stepped_start_s(start_s, now_s, deadline_s, rates)
    assert start_with_passing(start_s, now_s, deadline_s, rates) == pytest.approx(want, abs=0.05)


def test_no_deadline_and_no_arrivals_leave_the_start() -> None:
    rates = PassingRates.of([(10.0, 30.0), (float("inf"), 99.0)], window_s=60.0)
    assert rates.budgets_s == (10.0,)  # requests without a deadline never pass
    assert start_with_passing(120.0, 100.0, float("inf"), rates) == 120.0
    assert start_with_passing(120.0, 100.0, 700.0, PassingRates.of([], 60.0)) == 120.0
    with pytest.raises(ValueError, match="window_s"):
        PassingRates.of([], window_s=0.0)
