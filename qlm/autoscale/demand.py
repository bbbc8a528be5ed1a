"""What each model's traffic has been lately: the forecast half of the autoscaler's demand.

Question answered: at what rate do a model's requests arrive, how long are they, and how soon
must the most urgent of them start? `DemandWindow` keeps the arrivals of the last `window_s`
seconds (a sliding window on the caller's clock, deduplicated by request id: the live loop sees
a queued request on every round) and summarises them per model (`ModelDemand`). The forecast is
the recent rate held constant: the autoscaler re-reads it every round, so a ramp is followed
with the window's lag, and the queued backlog (qlm/autoscale/need.py) covers what the
window has not caught up with yet.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from qlm.types import Request


@dataclass(frozen=True, slots=True)
class ModelDemand:
    model: str
    rate_per_s: float  # arrivals per second over the window
    prompt_tokens_mean: float
    output_cap_mean: float  # mean of the requests' max_output_tokens
    ttft_budget_min_s: float  # the shortest TTFT budget (deadline less arrival) seen


@dataclass(frozen=True, slots=True)
class _Arrival:
    at_s: float
    request_id: str
    prompt_tokens: int
    output_cap: int
    ttft_budget_s: float


class DemandWindow:
    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self._arrivals: dict[str, deque[_Arrival]] = {}  # model -> arrivals in arrival order
        self._ids: set[str] = set()  # ids of the arrivals in the window

    def arrived(self, request: Request) -> None:
        """Note an arrival (again: ignored). Arrivals may come a little out of order."""
        if request.id in self._ids:
            return
        self._ids.add(request.id)
        self._arrivals.setdefault(request.model, deque()).append(
            _Arrival(
                request.arrival_at_s,
                request.id,
                request.prompt_tokens,
                request.max_output_tokens,
                request.ttft_deadline_at_s - request.arrival_at_s,
            )
        )

    def demand(self, now_s: float) -> tuple[ModelDemand, ...]:
        """Per model with arrivals in the last window_s seconds, by model name."""
        out: list[ModelDemand] = []
        for model in sorted(self._arrivals):
            seen = self._arrivals[model]
            self._trim(seen, now_s)
            if not seen:
                del self._arrivals[model]
                continue
            n = len(seen)
            out.append(
                ModelDemand(
                    model=model,
                    rate_per_s=n / self.window_s,
                    prompt_tokens_mean=sum(a.prompt_tokens for a in seen) / n,
                    output_cap_mean=sum(a.output_cap for a in seen) / n,
                    ttft_budget_min_s=min(a.ttft_budget_s for a in seen),
                )
            )
        return tuple(out)

    def _trim(self, seen: deque[_Arrival], now_s: float) -> None:
        horizon_s = now_s - self.window_s
        # Out-of-order arrivals: the head is the earliest noted, close enough to the earliest.
        while seen and seen[0].at_s < horizon_s:
            self._ids.discard(seen.popleft().request_id)
