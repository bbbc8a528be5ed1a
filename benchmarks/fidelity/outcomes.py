"""What either path reports per request (times from the run's start), what the estimator
predicted for it, and everything one live run measured."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from qlm.types import Request


@dataclass(frozen=True)
class Outcome:
    """One request's times, seconds from the run's start (either path)."""

    id: str
    slo_class: str
    model: str
    arrival_s: float
    dispatch_s: float | None
    first_token_s: float | None
    finish_s: float | None
    met_slo: bool
    evictions: int
    instance: str | None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def wait_s(self) -> float | None:
        return None if self.dispatch_s is None else self.dispatch_s - self.arrival_s


@dataclass(frozen=True)
class Prediction:
    """What the estimator predicted for a request from the first plan that held it."""

    plan_s: float  # when that plan was made
    ttft_mean_s: float  # mean time to first token from plan_s
    ttft_p_s: float  # the estimator's percentile bound, from plan_s
    annotated_mean_s: float | None = None  # the re-plan's annotation on the request, if any


@dataclass
class LiveRun:
    outcomes: list[Outcome]
    requests: list[Request]  # as enqueued, times from the run's start
    predictions: dict[str, Prediction]
    solve_s: list[float]
    swaps: int
    evictions: int
    replans: int
    engine_itl_s: float = math.nan  # the engines' own mean decode step over the run (metrics)
    # The plane's swap events over the run (metrics recorder): (seconds from the run's start,
    # "swap" when one starts or "swapped" when the new model serves, instance, detail)
    swap_events: list[tuple[float, str, str, str]] = field(default_factory=list)
