"""How late can a wait forecast be? A bound that holds for nine requests in ten, learnt from how
late the forecasts of the same class turned out (conformal prediction, adaptive).

A forecast (`Dispatcher.predict`) is the request's start in the dispatch schedule as it stands
when the request arrives: work that arrives later and goes first (a more urgent class, an
earlier due time), output lengths that differ from their estimate and report lag all make the
first token come later, by amounts that differ by class and grow with the load. `ForecastBand`
keeps, per SLO class, the last `window` scores of finished requests, each how many times later
than its forecast the first token came (log((ttft + FLOOR_S) / (forecast + FLOOR_S))), and
bounds a new forecast by a quantile of them: forecast times that factor. If scores are
exchangeable, the `quantile`-th bound holds with probability at least `quantile` whatever their
distribution (split conformal prediction); no distribution is assumed and nothing is fitted.
A ratio rather than a difference because waits scale with the backlog ahead, and scores are
learnt from requests that already ended, under a shorter backlog: on the wc-quick replays the
difference held for 7 % (live) and 49 % (simulated) of batch-1 requests at seed 0
(benchmarks/results/parity_bound.json), the ratio for 85 % and 100 % at seed 7
(parity_band_wc.json; live figures from replays since found late, which reached the plane up
to 30 s behind the scenario: qlm/replay/README.md).

Scores are not exchangeable when the load drifts: as a backlog builds, the forecasts' errors
move, and scores learnt a window ago bound the new forecasts wrongly for as long as the drift
lasts (wc-quick, seed 0, simulated: the interactive class's bound held for 70 % of requests,
for 4-50 % through the last 60 s of the run, with a fixed 0.9 level; an ad hoc measurement;
benchmarks/forecast_bound.py gives the held share per class-run). So the level adapts to
how the bounds it gave fared (adaptive conformal inference, Gibbs and Candes, NeurIPS 2021):
each finished request whose forecast had a bound moves the class's level by
`step` x (missed - (1 - quantile)), up 0.9 `step` on a miss and down 0.1 `step` on a hold.
Whatever the scores do, the share of bounds missed over T of them is then within
(1 + `step`) / (`step` T) of 1 - `quantile` (the rank kept within the scores there are costs
that only while even the largest kept score misses). `step` = 0.005 is the paper's.

A bound's outcome is known before the request ends when it missed: once a forecast's bound
has passed with no first token (`expire`), it has missed, and it counts at once; a hold counts
at the first token. Without that, the correction would come a whole wait late: on wc-quick
(seed 0, simulated, measured ad hoc) a backlog grew for 15 s with every bound missing before
the first of those misses was graded. `bound`, `first_token`, `expire` and `forget` keep each
plane's forecasts awaiting their first token here, so both grade them the same way.

With fewer scores than the level needs (9 for 0.9) it gives no bound. Both planes use it the
same way: the simulator observes every request's first token (qlm/sim/policies/qlm.py); the
API observes the requests it forecast once their records show a first token
(qlm/api/wait_forecast.py, at its queue refreshes; a capped sample).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass

DEFAULT_QUANTILE = 0.9
DEFAULT_WINDOW = 200
# Adaptive conformal inference's step (gamma): how far one bound's outcome moves the level.
DEFAULT_STEP = 0.005
# Waits below this count as this: the ratio of two near-zero waits says nothing (the API
# reports waits to the millisecond).
FLOOR_S = 0.01
# Stale bound times kept beyond twice the awaited forecasts before the heap is rebuilt
# (amortises the rebuild over at least this many removals).
COMPACT_SLACK = 1024


@dataclass(frozen=True, slots=True)
class _Awaited:
    """A forecast awaiting its request's first token."""

    slo_class: str
    arrival_at_s: float
    forecast_s: float
    upper_s: float | None


class ForecastBand:
    """Per SLO class, a bound of a forecast that holds for `quantile` of requests: a conformal
    quantile of the last `window` scores, at a level that adapts to the bounds' outcomes."""

    def __init__(
        self,
        quantile: float = DEFAULT_QUANTILE,
        window: int = DEFAULT_WINDOW,
        step: float | None = None,
        awaited_per_class: int | None = None,
    ) -> None:
        step = DEFAULT_STEP if step is None else step  # read now: a benchmark may set it
        if not 0.0 < quantile < 1.0:
            raise ValueError("quantile must be in (0, 1)")
        if window < 1:
            raise ValueError("window must be >= 1")
        if not 0.0 <= step < 1.0:
            raise ValueError("step must be in [0, 1)")
        self.quantile = quantile
        self.window = window
        self.step = step
        self._scores: dict[str, deque[float]] = {}
        self._levels: dict[str, float] = {}
        # Forecasts awaiting a first token, oldest first per class (at most `awaited_per_class`
        # per class: past it the oldest is dropped, never graded); the times their bounds pass
        # (a heap of (arrival + bound, id, class)); those graded a miss already.
        self._awaited_per_class = awaited_per_class
        self._awaited: dict[str, dict[str, _Awaited]] = {}
        self._due: list[tuple[float, str, str]] = []
        self._missed: set[str] = set()

    def observe(
        self,
        slo_class: str,
        forecast_s: float,
        first_token_s: float,
        upper_s: float | None = None,
    ) -> None:
        """A forecast of `slo_class` and the time to first token that followed (seconds);
        `upper_s` the bound given with the forecast (None: none was given)."""
        kept = self._scores.setdefault(slo_class, deque(maxlen=self.window))
        ratio = (max(0.0, first_token_s) + FLOOR_S) / (max(0.0, forecast_s) + FLOOR_S)
        kept.append(math.log(ratio))
        if upper_s is not None:
            self._grade(slo_class, first_token_s > upper_s)

    def _grade(self, slo_class: str, missed: bool) -> None:
        """Adaptive conformal inference's step: a miss raises the level, a hold lowers it."""
        level = self.level(slo_class) + self.step * (float(missed) - (1.0 - self.quantile))
        self._levels[slo_class] = min(1.0, max(0.0, level))

    def level(self, slo_class: str) -> float:
        """The class's current level: `quantile` until its bounds have been graded."""
        return self._levels.get(slo_class, self.quantile)

    def score(self, slo_class: str) -> float | None:
        """The class's conformal score: the ceil((n + 1) level)-th smallest of its n scores,
        within the smallest and the largest; None while n is too small for the `quantile`'s
        rank (fewer than 9 scores for 0.9)."""
        kept = self._scores.get(slo_class)
        n = 0 if kept is None else len(kept)
        if kept is None or math.ceil((n + 1) * self.quantile) > n:
            return None
        rank = min(n, max(1, math.ceil((n + 1) * self.level(slo_class))))
        return sorted(kept)[rank - 1]

    def upper_s(self, slo_class: str, forecast_s: float | None) -> float | None:
        """The bound of a forecast (None: no bound yet, or no forecast); below the forecast
        where the class's forecasts have mostly been late, never below zero."""
        if forecast_s is None:
            return None
        score = self.score(slo_class)
        if score is None:
            return None
        return max(0.0, (max(0.0, forecast_s) + FLOOR_S) * math.exp(score) - FLOOR_S)

    def observed(self, slo_class: str) -> int:
        """Scores kept for the class."""
        kept = self._scores.get(slo_class)
        return 0 if kept is None else len(kept)

    def bound(
        self, request_id: str, slo_class: str, arrival_at_s: float, forecast_s: float
    ) -> float | None:
        """A request's forecast (seconds after its arrival): its bound, kept with the forecast
        until the request's first token (`first_token`) or until it is forgotten."""
        upper_s = self.upper_s(slo_class, forecast_s)
        awaited = self._awaited.setdefault(slo_class, {})
        awaited[request_id] = _Awaited(slo_class, arrival_at_s, forecast_s, upper_s)
        cap = self._awaited_per_class
        if cap is not None and len(awaited) > cap:
            self.forget(next(iter(awaited)))
        if upper_s is not None:
            heapq.heappush(self._due, (arrival_at_s + upper_s, request_id, slo_class))
        return upper_s

    def first_token(self, request_id: str, first_token_at_s: float) -> None:
        """A forecast request's first token (absolute time): its score, and its bound's
        outcome unless `expire` graded it a miss already. Unknown ids are ignored."""
        entry = self._pop(request_id)
        if entry is None:
            return
        graded = request_id in self._missed
        self._missed.discard(request_id)
        upper_s = None if graded else entry.upper_s
        ttft_s = first_token_at_s - entry.arrival_at_s
        self.observe(entry.slo_class, entry.forecast_s, ttft_s, upper_s)

    def expire(self, now_s: float) -> None:
        """Grade a miss for every awaited forecast whose bound passed before `now_s` with no
        first token: it can no longer hold."""
        due = self._due
        while due and due[0][0] < now_s:
            _, request_id, slo_class = heapq.heappop(due)
            if request_id in self._awaited.get(slo_class, {}) and request_id not in self._missed:
                self._missed.add(request_id)
                self._grade(slo_class, True)

    def forget(self, request_id: str) -> None:
        """A forecast whose request will give no first token (refused, failed, cancelled, or
        no longer watched): dropped, its bound's outcome kept if already graded."""
        self._pop(request_id)
        self._missed.discard(request_id)

    def given(self, request_id: str) -> float | None:
        """The bound `bound` gave an awaited forecast (None: none, or not awaited)."""
        for awaited in self._awaited.values():
            entry = awaited.get(request_id)
            if entry is not None:
                return entry.upper_s
        return None

    def awaited(self, per_class: int | None = None) -> list[tuple[str, str]]:
        """(class, id) of the forecasts awaiting their first token, oldest first per class, at
        most the `per_class` oldest of each class (None: all)."""
        return [
            (c, rid)
            for c, awaited in self._awaited.items()
            for rid in itertools.islice(awaited, per_class)
        ]

    def _pop(self, request_id: str) -> _Awaited | None:
        for awaited in self._awaited.values():
            entry = awaited.pop(request_id, None)
            if entry is not None:
                self._compact()
                return entry
        return None

    def _compact(self) -> None:
        """Drop the bound times of forecasts no longer awaited once they outnumber the
        awaited ones (they are skipped lazily in `expire`; a long bound, a batch class's,
        would otherwise keep its entry for as long as the bound however soon it ended)."""
        live = sum(len(awaited) for awaited in self._awaited.values())
        if len(self._due) <= 2 * live + COMPACT_SLACK:
            return
        self._due = [
            (entry.arrival_at_s + entry.upper_s, rid, c)
            for c, awaited in self._awaited.items()
            for rid, entry in awaited.items()
            if entry.upper_s is not None
        ]
        heapq.heapify(self._due)
