"""Work that arrives after a request and is served before it: the wait forecast's correction
for the future.

A request's start in the dispatch schedule (qlm/agents/dispatch.py) is where it stands among
the requests queued *now*. The schedule serves them earliest-due first, so a request that
arrives later with a shorter TTFT budget is due earlier and goes ahead: under a steady stream
of interactive requests, a batch request queued behind a few seconds of work starts only
when that stream leaves the pool room. Its forecast must count the work that will pass it.

A request due at `deadline_s` (its TTFT deadline) is passed by an arrival at time t whose
budget b (TTFT deadline less arrival) has t + b < deadline_s. With rho(x) the pool's recent
arrival work rate (pool-seconds of work per second, `PassingRates`) of requests with a budget
shorter than x, the work that passes it before time S is the integral of
rho(deadline_s - t) dt from now to S, and its start is the first S past the schedule's
start S0 where the pool has done that much more:

    S = S0 + integral_now^S rho(deadline_s - t) dt.

rho is a step function (one step per budget), so `start_with_passing` solves it step by step.
The preemptive-priority queue's classic result is the case of one more urgent class
(S - now = (S0 - now) / (1 - rho)); here the urgency is the deadline, as the schedule's.
Requests of the same budget arrive due later and never pass; the most urgent class is never
passed. The rates are taken to hold for as long as they were measured over (`horizon_s`, the
window): a batch request due in an hour is passed by a minute of the stream at most, not by
an hour of it, which a burst would have it believe.

The result holds for a pool that keeps up with the passing work (rho < 1, as the priority
queue's). Where the more urgent arrivals alone overload the pool, the schedule does not serve
them all first: Moore-Hodgson keeps the most requests that can meet their deadlines and sheds
the costliest, of whatever class, so which requests a burst delays is decided by cost, not by
deadline, and the forecast is the schedule's own start (random:11 of qlm/sim/fuzz is such a
case: interactive work alone at 1.0-1.5x the pool; forecasting batch-1's passing there too,
as a first version of this did, said "late" for most of its batch-1 requests, nearly all of
which met their deadline).

Deadlines here are the TTFT deadlines; the schedule orders by due times shifted by the
engine work blocking each class (`Dispatcher.blocked_s`), so where classes are blocked by
different amounts the breakpoints are off by that difference.

A forecast, not a decision: the schedule the instances serve is unchanged. Both planes
forecast with it (`Dispatcher.predict`, qlm/agents/decision.py).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass

SAME_BUDGET_S = 1e-3  # budgets closer than this are one budget


@dataclass(frozen=True, slots=True)
class PassingRates:
    """A pool's recent arrival work rates by budget: `budgets_s` ascending and, for each,
    `rates[k]` the work per second (pool-seconds per second) of arrivals with a budget of
    at most `budgets_s[k]`."""

    budgets_s: tuple[float, ...]
    rates: tuple[float, ...]
    # How far ahead the rates are taken to hold: the window they were measured over (a
    # minute's arrivals say nothing of the next hour's).
    horizon_s: float

    @classmethod
    def of(cls, arrivals: Iterable[tuple[float, float]], window_s: float) -> PassingRates:
        """From (budget_s, pool-seconds of work) of each arrival of the last `window_s`."""
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        by_budget: dict[float, float] = {}
        for budget_s, work_s in arrivals:
            if not math.isfinite(budget_s):  # no deadline: due after every other request
                continue
            by_budget[budget_s] = by_budget.get(budget_s, 0.0) + work_s
        budgets = sorted(by_budget)
        rates, total = [], 0.0
        for budget_s in budgets:
            total += by_budget[budget_s] / window_s
            rates.append(total)
        return cls(tuple(budgets), tuple(rates), window_s)

    def below(self, budget_s: float) -> float:
        """The work rate of arrivals whose budget is shorter than `budget_s` by more than
        `SAME_BUDGET_S` (a deadline less an arrival differs in its last bits between
        requests of one class, which must not pass each other)."""
        k = bisect.bisect_left(self.budgets_s, budget_s - SAME_BUDGET_S)
        return self.rates[k - 1] if k > 0 else 0.0


def start_with_passing(
    start_s: float, now_s: float, deadline_s: float, passing: PassingRates
) -> float:
    """The first S >= start_s with S = start_s + the work that passes a request due at
    `deadline_s` from now to S (module docstring). Between two budgets' breakpoints
    (deadline_s - budget: past it, arrivals of that budget are due after the request) the
    rate is constant, so each stretch is solved in closed form."""
    if start_s <= now_s or not passing.budgets_s or not math.isfinite(deadline_s):
        return max(start_s, now_s)
    if passing.below(deadline_s - now_s) >= 1.0:  # overload: the schedule sheds by cost
        return start_s
    # Breakpoints in time order: arrivals of budget b pass until deadline_s - b.
    # Past the horizon, nothing is known to pass.
    last_s = now_s + passing.horizon_s
    ends = sorted(
        {min(e, last_s) for b in passing.budgets_s if (e := deadline_s - b - SAME_BUDGET_S) > now_s}
    )
    at_s, behind_s = now_s, start_s - now_s  # work still ahead of the request at `at_s`
    for end_s in ends:
        rate = passing.below(deadline_s - (at_s + end_s) / 2)  # constant on the stretch
        if rate < 1.0:
            reach_s = at_s + behind_s / (1.0 - rate)  # where the pool catches up
            if reach_s <= end_s:
                return reach_s
        behind_s += (rate - 1.0) * (end_s - at_s)
        at_s = end_s
    return at_s + behind_s  # past the last breakpoint nothing passes
