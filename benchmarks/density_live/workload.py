"""The traffic of benchmarks/density_live/ and what a client saw of it (pure: no I/O).

Question answered: which requests does a fleet serving more models than it has instances face,
and how many met their promise as the client measured it? `arrivals` draws Poisson arrivals
over `models` models with Zipf popularity; at `shift_at_s` the ranking turns by half the models
(the popular ones become the tail), as a day's mix moves, so the models the instances hold at
the start stop being the ones asked for. Each request is interactive or batch at random.
`summarise` gives, per class, the share whose first token the client saw within the class's
TTFT budget (a failed or unanswered request misses), and the TTFT percentiles.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.common.stats import percentile


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float  # from the start of the measured phase
    model: str
    slo_class: str
    index: int


@dataclass(frozen=True, slots=True)
class Seen:
    """One request as the client saw it (times in seconds from its send)."""

    arrival: Arrival
    ttft_s: float | None  # None: no first token (failed, or the run ended first)
    error: str = ""


def zipf_shares(models: Sequence[str], exponent: float) -> dict[str, float]:
    """Model -> share of the traffic, the first model the most popular."""
    weights = [1.0 / (rank + 1) ** exponent for rank in range(len(models))]
    total = sum(weights)
    return {m: w / total for m, w in zip(models, weights, strict=True)}


def arrivals(
    models: Sequence[str],
    rate_per_s: float,
    duration_s: float,
    seed: int,
    *,
    zipf_s: float = 1.0,
    interactive_share: float = 0.7,
    shift_at_s: float | None = None,
) -> list[Arrival]:
    """Poisson arrivals at `rate_per_s` for `duration_s`; after `shift_at_s` the popularity
    ranking is turned by half the models (module docstring)."""
    if rate_per_s <= 0 or duration_s <= 0:
        raise ValueError("rate_per_s and duration_s must be > 0")
    rng = random.Random(seed)
    turned = [*models[len(models) // 2 :], *models[: len(models) // 2]]
    before, after = zipf_shares(models, zipf_s), zipf_shares(turned, zipf_s)
    out: list[Arrival] = []
    at_s = rng.expovariate(rate_per_s)
    while at_s < duration_s:
        shares = after if shift_at_s is not None and at_s >= shift_at_s else before
        model = rng.choices(list(shares), weights=list(shares.values()))[0]
        slo_class = "interactive" if rng.random() < interactive_share else "batch"
        out.append(Arrival(round(at_s, 4), model, slo_class, len(out)))
        at_s += rng.expovariate(rate_per_s)
    return out


def summarise(seen: Sequence[Seen], ttft_budget_s: Mapping[str, float]) -> dict[str, Any]:
    """Per class: requests, met (first token within the budget), attainment, TTFT p50/p90/max
    over those answered; `failed` counts requests with no first token."""
    out: dict[str, Any] = {"requests": len(seen), "failed": sum(s.ttft_s is None for s in seen)}
    for name, budget_s in ttft_budget_s.items():
        mine = [s for s in seen if s.arrival.slo_class == name]
        ttfts = sorted(s.ttft_s for s in mine if s.ttft_s is not None)
        met = sum(t <= budget_s for t in ttfts)
        out[name] = {
            "requests": len(mine),
            "met": met,
            "attainment": met / len(mine) if mine else None,
            "ttft_p50_s": percentile(ttfts, 0.5),
            "ttft_p90_s": percentile(ttfts, 0.9),
            "ttft_max_s": ttfts[-1] if ttfts else None,
        }
    return out


def per_model(seen: Sequence[Seen], slo_class: str, budget_s: float) -> dict[str, str]:
    """Model -> "met/requests" of one class (where the misses fall)."""
    counts: dict[str, list[int]] = {}
    for s in seen:
        if s.arrival.slo_class != slo_class:
            continue
        got = counts.setdefault(s.arrival.model, [0, 0])
        got[1] += 1
        got[0] += s.ttft_s is not None and s.ttft_s <= budget_s
    return {m: f"{a}/{b}" for m, (a, b) in sorted(counts.items())}
