"""How good were the estimator's predictions on live runs? Each request's predicted TTFT from the
first plan that held it, against its actual wait and time to first token, and how often the
percentile bound held."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from benchmarks.fidelity.comparison import share
from benchmarks.fidelity.outcomes import LiveRun


@dataclass(frozen=True)
class EstimatorCheck:
    """Predicted vs actual waits of one run's requests (those a plan held and that were never
    evicted)."""

    run: str
    predicted: int
    annotated: int  # of those, how many carried a re-plan's annotation
    requests: int
    wait_abs_error_p50_s: float  # |predicted - actual| of dispatch - arrival
    ttft_abs_error_p50_s: float  # |predicted - actual| of first token - arrival
    wait_bound_held: float  # share with dispatch <= plan time + percentile TTFT
    ttft_bound_held: float  # share with first token <= plan time + percentile TTFT
    annotation_max_diff_s: float  # recomputed mean vs the annotation (a consistency check)
    pairs: tuple[tuple[float, float, float], ...]  # (predicted TTFT, actual wait, actual TTFT)


def check_estimator(name: str, live: LiveRun) -> EstimatorCheck:
    by_id = {o.id: o for o in live.outcomes}
    pairs = []
    wait_err, ttft_err, wait_held, ttft_held, diffs = [], [], [], [], []
    for rid, pred in live.predictions.items():
        o = by_id.get(rid)
        if o is None or o.evictions or o.dispatch_s is None or o.first_token_s is None:
            continue
        predicted_ttft = pred.plan_s + pred.ttft_mean_s - o.arrival_s
        bound_at = pred.plan_s + pred.ttft_p_s
        wait_err.append(abs(predicted_ttft - (o.dispatch_s - o.arrival_s)))
        ttft_err.append(abs(predicted_ttft - (o.first_token_s - o.arrival_s)))
        wait_held.append(o.dispatch_s <= bound_at)
        ttft_held.append(o.first_token_s <= bound_at)
        if pred.annotated_mean_s is not None:
            diffs.append(abs(pred.ttft_mean_s - pred.annotated_mean_s))
        pairs.append((predicted_ttft, o.dispatch_s - o.arrival_s, o.first_token_s - o.arrival_s))
    return EstimatorCheck(
        run=name,
        predicted=len(pairs),
        annotated=len(diffs),
        requests=len(live.outcomes),
        wait_abs_error_p50_s=statistics.median(wait_err) if wait_err else math.nan,
        ttft_abs_error_p50_s=statistics.median(ttft_err) if ttft_err else math.nan,
        wait_bound_held=share(wait_held),
        ttft_bound_held=share(ttft_held),
        annotation_max_diff_s=max(diffs) if diffs else math.nan,
        pairs=tuple(pairs),
    )
