"""What a run's machine-readable outputs hold: summary.json (one entry per policy, NaN
written as null) and requests.csv (one row per request and policy). Formats are documented in
qlm/sim/README.md.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

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
)
SUMMARY_KEYS = (
    "requests",
    "slo_attainment",
    "throughput_rps",
    "goodput_rps",
    "ttft_p50_s",
    "ttft_p99_s",
    "swaps",
    "evictions",
    "sim_wall_s",
)


def policy_summary(result: SimResult) -> dict[str, Any]:
    """One policy's entry of summary.json; NaN (no first token at all) becomes null."""
    raw = result.summary()
    return {key: _finite(raw[key]) for key in SUMMARY_KEYS}


def summary_document(scenario: str, seed: int, results: Sequence[SimResult]) -> dict[str, Any]:
    """summary.json: {"scenario", "seed", "policies": {name: policy_summary}}."""
    return {
        "scenario": scenario,
        "seed": seed,
        "policies": {r.policy: policy_summary(r) for r in results},
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
    """One row per request and policy (columns CSV_COLUMNS; empty cell = never happened).
    Returns the rows written."""
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
                    )
                )
                rows += 1
    return rows
