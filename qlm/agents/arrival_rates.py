"""Recent arrival rates per model, for swap decisions.

Question answered: how many requests of a model will arrive while an instance is away from it,
and miss their first token because of it? `ArrivalRates` keeps each model's arrivals of the
last `window_s` seconds (a sliding window on the caller's clock) with their TTFT budgets
(deadline less arrival); `at_risk(model, now, away_s)` is the rate of those whose budget is
shorter than `away_s`, times `away_s`: the requests expected while the model has no instance
that cannot wait for it to come back. A swap that takes a model's last instance away puts
them at risk (qlm/sim/policies/qlm_dispatch.py `swap_pays`); requests with budgets longer
than the absence wait and are served when the model returns.
"""

from __future__ import annotations

from collections import deque


class ArrivalRates:
    def __init__(self, window_s: float = 60.0) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self._seen: dict[str, deque[tuple[float, float]]] = {}  # model -> (at_s, budget_s)

    def arrived(self, model: str, at_s: float, budget_s: float) -> None:
        seen = self._seen.setdefault(model, deque())
        seen.append((at_s, budget_s))
        self._trim(seen, at_s)

    def at_risk(self, model: str, now_s: float, away_s: float) -> float:
        """Arrivals of `model` expected in the next `away_s` seconds, at the recent rate of
        those whose TTFT budget is shorter than `away_s`."""
        seen = self._seen.get(model)
        if not seen or away_s <= 0:
            return 0.0
        self._trim(seen, now_s)
        urgent = sum(1 for _, budget_s in seen if budget_s < away_s)
        return urgent / self.window_s * away_s

    def _trim(self, seen: deque[tuple[float, float]], now_s: float) -> None:
        while seen and seen[0][0] < now_s - self.window_s:
            seen.popleft()
