"""How late can a wait forecast be? A bound that holds for nine requests in ten, learnt from how
late the forecasts of the same class turned out (split conformal prediction).

A forecast (`Dispatcher.predict`) is the request's start in the dispatch schedule as it stands
when the request arrives: work that arrives later and goes first (a more urgent class, an
earlier due time), output lengths that differ from their estimate and report lag all make the
first token come later, by amounts that differ by class and grow with the load. `ForecastBand`
keeps, per SLO class, the last `window` scores of finished requests, each how many times later
than its forecast the first token came (log((ttft + FLOOR_S) / (forecast + FLOOR_S))), and
bounds a new forecast by their `quantile`: forecast times that factor. If scores are
exchangeable, the bound holds with probability at least `quantile` whatever their
distribution, which is what conformal prediction guarantees; no distribution is assumed and
nothing is fitted. A ratio rather than a difference because waits scale with the backlog
ahead, and scores are learnt from requests that already ended, under a shorter backlog: on the
wc-quick replays the difference held for 7 % (live) and 49 % (simulated) of batch-1
requests at seed 0 (benchmarks/results/parity_bound.json), the ratio for 85 % and 100 % at
seed 7 (parity_band_wc.json; live figures from replays since found late, which reached
the plane up to 30 s behind the scenario: qlm/replay/README.md). It follows a change of load
within `window` requests of the class. With fewer scores than the quantile needs (9 for 0.9)
it gives no bound.

Both planes use it the same way: the simulator observes every request's first token
(qlm/sim/policies/qlm.py); the API observes the requests it forecast once their records show
a first token (qlm/api/wait_forecast.py, at its queue refreshes; a capped sample).
"""

from __future__ import annotations

import math
from collections import deque

DEFAULT_QUANTILE = 0.9
DEFAULT_WINDOW = 200
# Waits below this count as this: the ratio of two near-zero waits says nothing (the API
# reports waits to the millisecond).
FLOOR_S = 0.01


class ForecastBand:
    """Per SLO class, the `quantile` bound of a forecast from the last `window` scores."""

    def __init__(self, quantile: float = DEFAULT_QUANTILE, window: int = DEFAULT_WINDOW) -> None:
        if not 0.0 < quantile < 1.0:
            raise ValueError("quantile must be in (0, 1)")
        if window < 1:
            raise ValueError("window must be >= 1")
        self.quantile = quantile
        self.window = window
        self._scores: dict[str, deque[float]] = {}

    def observe(self, slo_class: str, forecast_s: float, first_token_s: float) -> None:
        """A forecast of `slo_class` and the time to first token that followed (seconds)."""
        kept = self._scores.setdefault(slo_class, deque(maxlen=self.window))
        ratio = (max(0.0, first_token_s) + FLOOR_S) / (max(0.0, forecast_s) + FLOOR_S)
        kept.append(math.log(ratio))

    def score(self, slo_class: str) -> float | None:
        """The class's conformal score: the ceil((n + 1) q)-th smallest of its n scores;
        None while n is too small for one."""
        kept = self._scores.get(slo_class)
        n = 0 if kept is None else len(kept)
        rank = math.ceil((n + 1) * self.quantile)
        if kept is None or rank > n:
            return None
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
