"""What a run's machine-readable outputs hold: summary.json (one entry per policy, NaN
written as null, and the scenario's clairvoyant bound), requests.csv (one row per request and
policy) and timings.json (the wall-clock figures). Formats are documented in qlm/sim/README.md.

summary.json and requests.csv hold only what the simulation decided, so two runs with the same
scenario and seed write them byte for byte alike on any machine and under any load; the wall
clock goes to timings.json alone.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from qlm.sim.miss_causes import miss_cause, miss_cause_counts
from qlm.sim.report.prediction import prediction_accuracy
from qlm.sim.result import SimResult

CSV_COLUMNS = (
    "policy",
    "id",
    "class",
    "model",
    "instance",
    "arrival_s",
    "dispatch_s",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "met_slo",
    "evictions",
    "state",
    "miss_cause",
)
SUMMARY_KEYS = (
    "requests",
    "slo_attainment",
    "throughput_rps",
    "goodput_rps",
    "ttft_p50_s",
    "ttft_p99_s",
    "tbt_p50_ms",
    "tbt_p99_ms",
    "swaps",
    "evictions",
    "miss_causes",
)
TIMING_KEYS = ("sim_wall_s", "planner_wall_s", "events", "events_per_wall_s")


def policy_summary(result: SimResult) -> dict[str, Any]:
    """One policy's entry of summary.json; NaN (no first token at all) becomes null;
    miss_causes counts the missed requests by cause (qlm/sim/miss_causes.py); ttft_prediction,
    for policies that predict waits, how well the predictions held (prediction.py)."""
    raw = {**result.summary(), "miss_causes": miss_cause_counts(result.outcomes, result.end_s)}
    entry = {key: _finite(raw[key]) for key in SUMMARY_KEYS}
    accuracy = prediction_accuracy(result)
    if accuracy is not None:
        entry["ttft_prediction"] = accuracy
    reuse = result.prefix_reuse()
    if reuse is not None:
        entry["prefix"] = reuse
    return entry


def summary_document(
    scenario: str,
    seed: int,
    results: Sequence[SimResult],
    bound: Mapping[str, float] | None = None,
    oracle_reuse: float | None = None,
) -> dict[str, Any]:
    """summary.json: {"scenario", "seed", "policies": {name: policy_summary}}, "bound"
    (overall and per class, qlm/sim/bound.py) when given, and "prefix_oracle_reuse" (the
    share of prompt tokens one infinite cache would hold, qlm/sim/workload/prefixes.py) when
    the requests carry prefixes."""
    doc: dict[str, Any] = {
        "scenario": scenario,
        "seed": seed,
        "policies": {r.policy: policy_summary(r) for r in results},
    }
    if bound is not None:
        doc["bound"] = dict(bound)
    if oracle_reuse is not None:
        doc["prefix_oracle_reuse"] = oracle_reuse
    return doc


def timings_document(scenario: str, seed: int, results: Sequence[SimResult]) -> dict[str, Any]:
    """timings.json: this machine's wall-clock figures per policy (TIMING_KEYS), which differ
    from run to run and so stay out of summary.json."""
    return {
        "scenario": scenario,
        "seed": seed,
        "policies": {
            r.policy: dict(
                zip(
                    TIMING_KEYS,
                    (r.sim_wall_s, r.planner_wall_s, r.events_processed, r.events_per_s),
                    strict=True,
                )
            )
            for r in results
        },
    }


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


def write_requests_csv(path: Path, results: Iterable[SimResult]) -> int:
    """One row per request and policy (columns CSV_COLUMNS; empty cell = never happened, or
    no miss cause for a request that met its SLO). Returns the rows written."""
    rows = 0
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for result in results:
            for o in result.outcomes:
                writer.writerow(
                    (
                        result.policy,
                        o.request_id,
                        o.slo_class,
                        o.model,
                        o.instance_id or "",
                        _cell(o.arrival_s),
                        _cell(o.dispatch_s),
                        _cell(o.first_token_s),
                        _cell(o.finish_s),
                        _cell(o.ttft_s),
                        int(o.met_slo),
                        o.evictions,
                        str(o.state),
                        miss_cause(o, result.end_s) or "",
                    )
                )
                rows += 1
    return rows
