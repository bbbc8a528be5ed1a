"""How late can a wait forecast be? A bound that holds for nine requests in ten, learnt from how
late the forecasts of the same class turned out (split conformal prediction).

A forecast (`Dispatcher.predict`) is the request's start in the dispatch schedule as it stands
when the request arrives: work that arrives later and goes first (a more urgent class, an
earlier due time), output lengths that differ from their estimate and report lag all make the
first token come later, by amounts that differ by class and by load. `ForecastBand` keeps, per
SLO class, the last `window` residuals (first token seen less forecast, seconds) and bounds a
new forecast by adding their `quantile`: if residuals are exchangeable (the same load regime),
the bound holds with probability at least `quantile` whatever their distribution, which is
what conformal prediction guarantees; no distribution is assumed and nothing is tuned. It
follows a change of load within `window` requests of the class. With fewer residuals than the
quantile needs (9 for 0.9) it gives no bound.

Both planes use it the same way: the simulator observes every request's first token
(qlm/sim/policies/qlm.py); the API observes the requests it forecast once their records show
a first token (qlm/api/wait_forecast.py, at its queue refreshes; a capped sample).
"""

from __future__ import annotations

import math
from collections import deque

DEFAULT_QUANTILE = 0.9
DEFAULT_WINDOW = 200


class ForecastBand:
    """Per SLO class, the `quantile` bound of a forecast from the last `window` residuals."""

    def __init__(self, quantile: float = DEFAULT_QUANTILE, window: int = DEFAULT_WINDOW) -> None:
        if not 0.0 < quantile < 1.0:
            raise ValueError("quantile must be in (0, 1)")
        if window < 1:
            raise ValueError("window must be >= 1")
        self.quantile = quantile
        self.window = window
        self._residuals: dict[str, deque[float]] = {}

    def observe(self, slo_class: str, forecast_s: float, first_token_s: float) -> None:
        """A forecast of `slo_class` and the time to first token that followed (seconds)."""
        kept = self._residuals.setdefault(slo_class, deque(maxlen=self.window))
        kept.append(first_token_s - forecast_s)

    def margin_s(self, slo_class: str) -> float | None:
        """What to add to a forecast of the class: the ceil((n + 1) q)-th smallest of its n
        residuals (the conformal quantile); None while n is too small for one."""
        kept = self._residuals.get(slo_class)
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
        margin_s = self.margin_s(slo_class)
        return None if margin_s is None else max(0.0, forecast_s + margin_s)

    def observed(self, slo_class: str) -> int:
        """Residuals kept for the class."""
        kept = self._residuals.get(slo_class)
        return 0 if kept is None else len(kept)
