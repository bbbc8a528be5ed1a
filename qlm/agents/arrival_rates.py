"""Recent arrival rates per model, for swap decisions.

Question answered: how many requests of a model will arrive while an instance is away from it,
and miss their first token because of it? `ArrivalRates` keeps each model's arrivals of the
last `memory_s` seconds (a sliding window on the caller's clock) with their TTFT budgets
(deadline less arrival); `at_risk(model, now, away_s)` is the rate of those whose budget is
shorter than `away_s`, times `away_s`: the requests expected while the model has no instance
that cannot wait for it to come back. A swap that takes a model's last instance away puts
them at risk (qlm/agents/decision.py `swap_pays`); requests with budgets longer
than the absence wait and are served when the model returns.

`expected(model, now, span_s)` counts all of them: the arrivals an instance would serve over
a stay on a model no other instance serves (`swap_pays`'s gain).

Rates are taken over the window, or over the time watched (since the first arrival of any
model) while that is shorter: five arrivals in the first five seconds are a rate of one a
second. Taken over the whole window they read as one every twelve seconds, and a plane just
started gave away a model's only instance in the lull before its traffic (`qlm simulate
many:27`, measured ad hoc before the change: the model the fleet file placed there met 5
of its 106 requests).

A forecast over a horizon longer than the window (a 70B's round trip away from its model is
minutes) takes its rate over the window when the window holds at least `MIN_COUNT` of the
arrivals it counts, else back to the `MIN_COUNT`-th newest (within `memory_s`, five windows by
default; all of the memory's when it holds fewer): an adaptive look-back, as long as a rate
that sparse needs. A model that arrives a few times a minute in bursts has windows with one or
two arrivals; read over the window alone, that lull stood for the next minutes, and the gate
gave away the model's only instance for a round trip of minutes (sims/many-quick.yaml, seed 1,
measured ad hoc before the change: the second 70B met 68 of its 163 requests, all 163 under
static placement). A busy model's rate stays the window's, so the end of its phase is seen
within a window (wb-quick: a look-back of five windows for every model held instances on
models whose phase had ended; qlm's throughput fell to 0.59-0.70 of edf's). Forecasts within
the window read the window alone.

The swap gate reads both sides of a move to a model no instance serves with hysteresis
(`Side`): what it loses at the higher of the recent rate and the longer-run rate (over
`LONG_WINDOWS` windows, or the horizon when longer), what it gains at the lower; a model whose
arrivals stopped (`stopped`: an empty window where the memory's rate expects `MIN_COUNT`)
reads 0 either way. Per-model streams are bursty (gamma gaps with a cv of
2 and more): a model in a lull reads at half its rate over a window, another in a burst at
twice its own, and a gate that compares one window's reads leaves a busy model in its lull for
a tail model in its burst and comes back a round trip later (sims/many-quick.yaml at seed 7,
measured ad hoc before the change: code-13b-06 lost 127 of its 290 requests to swaps that
gained 175 elsewhere in all).

`recent(model, now)` gives the window's arrivals themselves (those noted with their queued
item): the wait forecast prices the work among them that will pass a queued request
(qlm/estimator/passing.py).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from enum import Enum

from qlm.agents.queued import QueuedItem

# The shortest time a rate is taken over (one arrival just seen is not a rate of thousands).
MIN_SPAN_S = 1.0
# The fewest arrivals a forecast past the window takes its rate from: a count of n is off by
# about 1 / sqrt(n) of itself (Poisson), a third at ten.
MIN_COUNT = 10
# The longer-run rate the swap gate's hysteresis reads beside the recent one: over this many
# windows, or the forecast's horizon when longer (within the memory).
LONG_WINDOWS = 2.0


class Side(Enum):
    """Which read of a rate a forecast takes: the recent rate (`POINT`), or, for the swap
    gate's hysteresis, the higher (`HIGH`: what a swap loses) or the lower (`LOW`: what it
    gains) of the recent and the longer-run rate."""

    POINT = "point"
    HIGH = "high"
    LOW = "low"


class ArrivalRates:
    def __init__(self, window_s: float = 60.0, memory_s: float | None = None) -> None:
        """`window_s`: the recent rate's look-back; `memory_s` (default: five windows): how
        long arrivals are kept for forecasts over longer horizons."""
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self.memory_s = max(window_s, 5.0 * window_s if memory_s is None else memory_s)
        # model -> (at_s, budget_s, the queued item where known)
        self._seen: dict[str, deque[tuple[float, float, QueuedItem | None]]] = {}
        self._since_s = math.inf  # the first arrival noted (of any model): watching since

    def arrived(
        self, model: str, at_s: float, budget_s: float, item: QueuedItem | None = None
    ) -> None:
        seen = self._seen.setdefault(model, deque())
        self._since_s = min(self._since_s, at_s)
        seen.append((at_s, budget_s, item))
        self._trim(seen, at_s)

    def rate_per_s(self, model: str, now_s: float) -> float:
        """The model's arrivals per second over the last `window_s`, always the whole window
        (the logos baseline's rate, qlm/sim/policies/logos.py, kept as it was measured; the
        swap gate's `at_risk` and `expected` take the time watched while shorter)."""
        return self._count(model, now_s) / self.window_s

    def watched_for(self, now_s: float, span_s: float) -> bool:
        """Whether arrivals have been watched for at least `span_s` (the rates of a shorter
        watch say nothing about that long: a model with no arrival yet may be the busiest)."""
        return now_s - self._since_s >= span_s

    def recent(self, model: str, now_s: float) -> list[tuple[float, QueuedItem]]:
        """(budget_s, item) of the model's arrivals of the last `window_s` noted with
        their item, oldest first."""
        seen = self._seen.get(model)
        if not seen:
            return []
        self._trim(seen, now_s)
        since_s = now_s - self.window_s
        return [(b, item) for at_s, b, item in seen if item is not None and at_s >= since_s]

    def at_risk(self, model: str, now_s: float, away_s: float, side: Side = Side.POINT) -> float:
        """Arrivals of `model` expected in the next `away_s` seconds, at the rate (read as
        `side` says) of those whose TTFT budget is shorter than `away_s`."""
        if away_s <= 0:
            return 0.0
        return self._read_per_s(model, now_s, away_s, away_s, side) * away_s

    def saved_by_wake(
        self, model: str, now_s: float, spans_s: tuple[float, float], side: Side = Side.POINT
    ) -> float:
        """Arrivals of `model` a wake keeps that a cold load loses: those at risk over the
        cold load less those at risk over the wake (`spans_s`: the wake's and the load's
        seconds). What a model asleep is worth (qlm/agents/warming.py) and what dropping its
        only warm copy breaks (qlm/agents/standby_rules.py)."""
        wake_s, load_s = spans_s
        return self.at_risk(model, now_s, load_s, side) - self.at_risk(model, now_s, wake_s, side)

    def expected(self, model: str, now_s: float, span_s: float, side: Side = Side.POINT) -> float:
        """Arrivals of `model` expected in the next `span_s` seconds, at its rate (read as
        `side` says)."""
        if span_s <= 0:
            return 0.0
        return self._read_per_s(model, now_s, span_s, None, side) * span_s

    def _read_per_s(
        self,
        model: str,
        now_s: float,
        horizon_s: float,
        budget_below_s: float | None,
        side: Side,
    ) -> float:
        """The recent rate (`_rate_per_s`), or its higher or lower read against the
        longer-run rate (over `LONG_WINDOWS` windows or the horizon, within the memory);
        0 for a model that stopped (`stopped`)."""
        if self.stopped(model, now_s):
            return 0.0
        recent = self._rate_per_s(model, now_s, horizon_s, budget_below_s)
        if side is Side.POINT:
            return recent
        back_s = min(max(horizon_s, LONG_WINDOWS * self.window_s), self.memory_s)
        count = self._count(model, now_s, budget_below_s, back_s)
        longer = count / self._span_s(now_s, back_s)
        return max(recent, longer) if side is Side.HIGH else min(recent, longer)

    def stopped(self, model: str, now_s: float) -> bool:
        """Whether the model's arrivals stopped: none in the last window, where its rate over
        the memory expects at least `MIN_COUNT` (a lull that long is a stop; a sparse model's
        empty window is not, and its rate is read further back). Without this, a stopped
        model's rate, read back to its tenth newest arrival or over the longer run, held its
        last instance on it for minutes (wb-quick's phases end: measured ad hoc, the last
        swap of seed 7 came 260 s late)."""
        if self._count(model, now_s):
            return False
        remembered = self._count(model, now_s, None, self.memory_s)
        return remembered / self._span_s(now_s, self.memory_s) * self.window_s >= MIN_COUNT

    def _rate_per_s(
        self, model: str, now_s: float, horizon_s: float, budget_below_s: float | None = None
    ) -> float:
        """The rate of those arrivals (budget below `budget_below_s`, if given) over the
        window; for a horizon past a window holding fewer than `MIN_COUNT`, back to the
        `MIN_COUNT`-th newest, or over the whole memory when it holds fewer (module
        docstring)."""
        count = self._count(model, now_s, budget_below_s)
        if horizon_s <= self.window_s or count >= MIN_COUNT:
            return count / self._span_s(now_s)
        ages = self._youngest_ages_s(model, now_s, budget_below_s)
        if len(ages) < MIN_COUNT:  # fewer in all the memory: the memory's rate
            return len(ages) / self._span_s(now_s, self.memory_s)
        back_s = max(self.window_s, ages[-1])  # back to the MIN_COUNT-th newest
        return MIN_COUNT / self._span_s(now_s, back_s)

    def _youngest_ages_s(
        self, model: str, now_s: float, budget_below_s: float | None
    ) -> list[float]:
        """The ages of the model's `MIN_COUNT` youngest remembered arrivals (budget below
        `budget_below_s`, if given), youngest first."""
        seen = self._seen.get(model, ())
        ages = (
            now_s - at_s
            for at_s, b, _ in seen
            if (budget_below_s is None or b < budget_below_s) and now_s - at_s <= self.memory_s
        )
        return heapq.nsmallest(MIN_COUNT, ages)

    def _count(
        self,
        model: str,
        now_s: float,
        budget_below_s: float | None = None,
        back_s: float | None = None,
    ) -> int:
        """The model's arrivals of the last `back_s` (default `window_s`) whose TTFT budget is
        shorter than `budget_below_s` (None: all of them, an infinite budget included)."""
        seen = self._seen.get(model)
        if not seen:
            return 0
        self._trim(seen, now_s)
        since_s = now_s - (self.window_s if back_s is None else back_s)
        if budget_below_s is None:
            return sum(1 for at_s, _, _ in seen if at_s >= since_s)
        return sum(1 for at_s, b, _ in seen if b < budget_below_s and at_s >= since_s)

    def _span_s(self, now_s: float, back_s: float | None = None) -> float:
        """The time a rate is taken over: `back_s` (default the window), or the time watched
        while shorter (n arrivals in the first 5 s are a rate of n / 5, not n / 60)."""
        back = self.window_s if back_s is None else back_s
        return max(MIN_SPAN_S, min(back, now_s - self._since_s))

    def _trim(self, seen: deque[tuple[float, float, QueuedItem | None]], now_s: float) -> None:
        """Drop the oldest noted while past the memory. Arrivals may be noted a little out of
        order (a live plane notes what it reads, other replicas' included), so this bounds
        the memory; the counts filter by time themselves."""
        while seen and seen[0][0] < now_s - self.memory_s:
            seen.popleft()
