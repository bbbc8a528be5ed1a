"""How far is the simulator from live vLLM on one run? Per-request TTFT and end-to-end latency
percentiles and their relative errors, per-request paired errors, SLO attainment, swaps,
evictions, waits and decode steps, live against simulated."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks.fidelity.outcomes import LiveRun, Outcome
from benchmarks.fidelity.settings import UP_FRONT
from benchmarks.fidelity.simulated import sim_outcomes
from qlm.sim.result import SimResult

QUANTILES = (0.5, 0.9, 0.99)


def quantile(values: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(values, dtype=float), q)) if values else math.nan


def rel_error(sim: float, live: float) -> float:
    return abs(sim - live) / live if live > 0 else math.nan


# A run's live result, its simulation on the up-front profiles, and on the re-measured one.
Triple = tuple["LiveRun", SimResult, SimResult | None]


@dataclass(frozen=True)
class Comparison:
    """One run: live vs simulated."""

    run: str
    profile: str  # which step model the simulator used: UP_FRONT, JUST_BEFORE or TOGETHER
    requests: int
    completed_live: int
    completed_sim: int
    ttft_live: dict[str, float]
    ttft_sim: dict[str, float]
    e2e_live: dict[str, float]
    e2e_sim: dict[str, float]
    ttft_paired_median_error: float  # median over requests of |sim - live| / live
    e2e_paired_median_error: float
    attainment_live: dict[str, float]
    attainment_sim: dict[str, float]
    swaps_live: int
    swaps_sim: int
    evictions_live: int
    evictions_sim: int
    wait_p50_live_s: float
    wait_p50_sim_s: float
    service_ttft_p50_live_s: float  # first token - dispatch
    service_ttft_p50_sim_s: float
    itl_engine_live_s: float  # mean decode step inside the live engines (vLLM's own times)
    itl_live_s: float  # mean (finish - first token) / (tokens - 1), as QLM saw it
    itl_sim_s: float
    disagreements: Disagreements | None = None

    def error(self, metric: str, q: str) -> float:
        live = getattr(self, f"{metric}_live")[q]
        return rel_error(getattr(self, f"{metric}_sim")[q], live)


def compare(name: str, live: LiveRun, sim: SimResult, profile: str = UP_FRONT) -> Comparison:
    """One run's live outcomes against its simulated ones, over the requests both have."""
    lv = {o.id: o for o in live.outcomes}
    sv = {o.id: o for o in sim_outcomes(sim)}
    both = [i for i in lv if i in sv]
    tokens = {r.id: r.max_output_tokens for r in live.requests}
    return Comparison(
        run=name,
        profile=profile,
        requests=len(both),
        completed_live=sum(lv[i].finish_s is not None for i in both),
        completed_sim=sum(sv[i].finish_s is not None for i in both),
        ttft_live=_dist(lv, both, "ttft_s"),
        ttft_sim=_dist(sv, both, "ttft_s"),
        e2e_live=_dist(lv, both, "e2e_s"),
        e2e_sim=_dist(sv, both, "e2e_s"),
        ttft_paired_median_error=_paired(lv, sv, both, "ttft_s"),
        e2e_paired_median_error=_paired(lv, sv, both, "e2e_s"),
        attainment_live=_attainment(lv, both),
        attainment_sim=_attainment(sv, both),
        swaps_live=live.swaps,
        swaps_sim=sim.total_swaps,
        evictions_live=live.evictions,
        evictions_sim=sim.evictions,
        wait_p50_live_s=_median_of([lv[i].wait_s for i in both]),
        wait_p50_sim_s=_median_of([sv[i].wait_s for i in both]),
        service_ttft_p50_live_s=_median_of([_service(lv[i]) for i in both]),
        service_ttft_p50_sim_s=_median_of([_service(sv[i]) for i in both]),
        itl_engine_live_s=live.engine_itl_s,
        itl_live_s=_mean_itl(lv, tokens, both),
        itl_sim_s=_mean_itl(sv, tokens, both),
        disagreements=disagreements(lv, sv, both),
    )


@dataclass(frozen=True)
class Disagreements:
    """The requests whose SLO outcome differs between the planes, each put down to where its
    live time went beyond the simulated one: `wait` (dispatch - arrival longer live: a queue or
    decision difference), `engine` (first token - dispatch longer live: the engine or the path
    to it), `evicted` (more evictions live) or `unfinished` (no live first token). Medians of
    the extra seconds over the requests missed live only."""

    missed_live_only: int
    missed_sim_only: int
    by_cause: dict[str, int]  # cause -> requests met simulated and missed live
    by_model: dict[str, int]  # model -> requests met simulated and missed live
    extra_wait_p50_s: float
    extra_engine_p50_s: float
    # model -> when its first request was dispatched, live and simulated (s from the start):
    # for a model no instance holds at the start, when its first load ended
    first_dispatch_s: dict[str, tuple[float, float]]


def disagreements(
    live: Mapping[str, Outcome], sim: Mapping[str, Outcome], ids: list[str]
) -> Disagreements:
    """Request by request: which requests only one plane missed, and why live did."""
    only_live = [i for i in ids if sim[i].met_slo and not live[i].met_slo]
    return Disagreements(
        missed_live_only=len(only_live),
        missed_sim_only=sum(live[i].met_slo and not sim[i].met_slo for i in ids),
        by_cause=dict(Counter(_cause(live[i], sim[i]) for i in only_live)),
        by_model=dict(Counter(live[i].model for i in only_live)),
        first_dispatch_s={
            m: (_first_dispatch(live, ids, m), _first_dispatch(sim, ids, m))
            for m in sorted({live[i].model for i in ids})
        },
        extra_wait_p50_s=_median_of([_extra(live[i].wait_s, sim[i].wait_s) for i in only_live]),
        extra_engine_p50_s=_median_of(
            [_extra(_service(live[i]), _service(sim[i])) for i in only_live]
        ),
    )


def _first_dispatch(outcomes: Mapping[str, Outcome], ids: list[str], model: str) -> float:
    times = [
        d for i in ids if outcomes[i].model == model and (d := outcomes[i].dispatch_s) is not None
    ]
    return min(times, default=math.nan)


def _cause(live: Outcome, sim: Outcome) -> str:
    if live.evictions > sim.evictions:
        return "evicted"
    if live.first_token_s is None:
        return "unfinished"
    wait = _extra(live.wait_s, sim.wait_s) or 0.0
    engine = _extra(_service(live), _service(sim)) or 0.0
    return "wait" if wait > engine else "engine"


def _extra(live_s: float | None, sim_s: float | None) -> float | None:
    return None if live_s is None or sim_s is None else live_s - sim_s


def _dist(outcomes: Mapping[str, Outcome], ids: list[str], attr: str) -> dict[str, float]:
    values = [v for i in ids if (v := getattr(outcomes[i], attr)) is not None]
    return {f"p{round(q * 100)}": quantile(values, q) for q in QUANTILES}


def _paired(
    live: Mapping[str, Outcome], sim: Mapping[str, Outcome], ids: list[str], attr: str
) -> float:
    """The median over requests of |sim - live| / live."""
    errs = [
        abs(s - x) / x
        for i in ids
        if (x := getattr(live[i], attr)) is not None
        and (s := getattr(sim[i], attr)) is not None
        and x > 0
    ]
    return statistics.median(errs) if errs else math.nan


def _attainment(outcomes: Mapping[str, Outcome], ids: list[str]) -> dict[str, float]:
    out = {"overall": share([outcomes[i].met_slo for i in ids])}
    for c in sorted({outcomes[i].slo_class for i in ids}):
        out[c] = share([outcomes[i].met_slo for i in ids if outcomes[i].slo_class == c])
    return out


def _median_of(values: list[float | None]) -> float:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else math.nan


def _service(o: Outcome) -> float | None:
    """First token - dispatch."""
    if o.first_token_s is None or o.dispatch_s is None:
        return None
    return o.first_token_s - o.dispatch_s


def _mean_itl(outcomes: Mapping[str, Outcome], tokens: Mapping[str, int], ids: list[str]) -> float:
    """Decode time over decode steps, summed over completed requests."""
    seconds = steps = 0.0
    for i in ids:
        o = outcomes[i]
        if o.finish_s is not None and o.first_token_s is not None and tokens.get(i, 0) > 1:
            seconds += o.finish_s - o.first_token_s
            steps += tokens[i] - 1
    return seconds / steps if steps else math.nan


def share(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else math.nan
