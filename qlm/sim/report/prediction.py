"""How well a policy's wait estimate held: its predicted time to first token for each request
(made when the request arrived) against what the simulator then did. Policies that predict
nothing get no entry."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from qlm.sim.result import RequestOutcome, SimResult, TtftPrediction

# Prompt-length bands (tokens): [low, high)
BANDS = (("<1k", 0, 1024), ("1k-8k", 1024, 8192), (">=8k", 8192, math.inf))


def prediction_accuracy(result: SimResult) -> dict[str, Any] | None:
    """{"overall": stats, "by_class": {class: stats}, "by_prompt_band": {band: stats}}, where
    stats: `requests` with a prediction, `median_abs_error_s` (|actual - predicted| TTFT over
    those that got a first token), `within_2x` (share whose actual TTFT was at most twice the
    prediction plus one second), `predicted_miss` (requests predicted to miss),
    `predicted_miss_held` (share of those that did miss), `bounded` (predictions that came
    with a bound for nine in ten, `TtftPrediction.upper_s`) and `bound_held` (share of those
    whose TTFT came within it). None without predictions."""
    predictions = result.ttft_predictions
    if not predictions:
        return None
    rows = [(o, predictions[o.request_id]) for o in result.outcomes if o.request_id in predictions]
    by_class = {
        name: _stats((o, p) for o, p in rows if o.slo_class == name)
        for name in result.slo_classes
        if any(o.slo_class == name for o, _ in rows)
    }
    by_band = {
        name: _stats((o, p) for o, p in rows if low <= p.prompt_tokens < high)
        for name, low, high in BANDS
        if any(low <= p.prompt_tokens < high for _, p in rows)
    }
    overall = _stats(rows)
    return {"overall": overall, "by_class": by_class, "by_prompt_band": by_band}


def _stats(pairs: Iterable[tuple[RequestOutcome, TtftPrediction]]) -> dict[str, Any]:
    errors: list[float] = []
    within = 0
    predicted = missed = held = 0
    bounds: list[bool] = []
    for outcome, prediction in pairs:
        predicted_s = prediction.predicted_s
        if prediction.upper_s is not None and outcome.ttft_s is not None:
            bounds.append(outcome.ttft_s <= prediction.upper_s)
        if predicted_s is None:
            missed += 1
            held += not outcome.met_slo
            continue
        predicted += 1
        actual_s = outcome.ttft_s
        if actual_s is None:
            continue
        errors.append(abs(actual_s - predicted_s))
        within += actual_s <= 2 * predicted_s + 1.0
    return {
        "requests": predicted,
        "median_abs_error_s": float(np.median(errors)) if errors else None,
        "within_2x": within / len(errors) if errors else None,
        "predicted_miss": missed,
        "predicted_miss_held": held / missed if missed else None,
        "bounded": len(bounds),
        "bound_held": sum(bounds) / len(bounds) if bounds else None,
    }
