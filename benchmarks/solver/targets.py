"""Did the planner meet its targets? Per case and planner: wall time, objective against EDF,
statuses; then PASS / MISS for 100 x 16 within 1 s no worse than EDF, 200 x 32 within its 2 s
limit, and the grouping figures."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from benchmarks.common.stats import median
from benchmarks.common.tables import target_row
from benchmarks.solver.inputs import Case
from benchmarks.solver.runs import BACKENDS

GROUPING_TARGET_REQUESTS = 100_000
REL_TOL = 1e-9


def summarise(runs: Sequence[dict[str, Any]], case: Case, planner: str) -> dict[str, Any]:
    mine = [r for r in runs if r["case"] == case.label and r["planner"] == planner]
    ok = [r for r in mine if r["status"] != "error"]
    walls = [r["wall_s"] for r in mine]
    ratios = [r["ratio_vs_edf"] for r in ok if r.get("ratio_vs_edf") is not None]
    return {
        "case": case.label,
        "planner": planner,
        "time_limit_s": None if planner == "edf" else case.time_limit_s,
        "runs": len(mine),
        "wall_s_median": statistics.median(walls),
        "wall_s_max": max(walls),
        "solve_wall_s_median": median([r["solve_wall_s"] for r in ok]),
        "ratio_median": median(ratios),
        "ratio_max": max(ratios) if ratios else None,
        "no_worse_than_edf": sum(r <= 1 + REL_TOL for r in ratios) if ratios else None,
        "better_than_edf": sum(r < 1 - 1e-6 for r in ratios) if ratios else None,
        "statuses": dict(Counter(r["status"] for r in mine)),
        "swaps_median": median([r["swaps"] for r in ok]),
        "late_groups_median": median([r["late_groups"] for r in ok]),
        "baseline_mismatches": sum(_baseline_mismatch(r) for r in ok),
    }


def _baseline_mismatch(run: dict[str, Any]) -> bool:
    """The MILP's own EDF objective should equal the EDF planner's on the same input."""
    own, edf = run.get("baseline_objective"), run.get("edf_objective")
    if own is None or edf is None:
        return False
    return bool(abs(own - edf) > REL_TOL * max(1.0, abs(edf)))


def evaluate_targets(
    summaries: Sequence[dict[str, Any]], grouping: list[dict[str, Any]] | str
) -> list[dict[str, str]]:
    rows = [_target_100x16(summaries, b) for b in BACKENDS]
    rows += [_target_200x32(summaries, b) for b in BACKENDS]
    if isinstance(grouping, str):
        return [*rows, target_row("grouping", "-", grouping, None)]
    for row in grouping:
        rows += _grouping_targets(row)
    return rows


def _find(summaries: Sequence[dict[str, Any]], case: str, planner: str) -> dict[str, Any] | None:
    return next((s for s in summaries if s["case"] == case and s["planner"] == planner), None)


def _target_100x16(summaries: Sequence[dict[str, Any]], backend: str) -> dict[str, str]:
    target = "100 x 16: median <= 1 s, objective <= EDF"
    s = _find(summaries, "100 x 16", f"milp/{backend}")
    if s is None:
        return target_row(target, backend, "-", None)
    errors = s["statuses"].get("error", 0)
    ok = s["wall_s_median"] <= 1.0 and s["no_worse_than_edf"] == s["runs"] and not errors
    measured = (
        f"median {s['wall_s_median']:.3f} s; no worse than EDF {s['no_worse_than_edf']}/{s['runs']}"
    )
    return target_row(target, backend, measured, ok)


def _target_200x32(summaries: Sequence[dict[str, Any]], backend: str) -> dict[str, str]:
    target = "200 x 32 honours a 2 s limit"
    s = _find(summaries, "200 x 32", f"milp/{backend}")
    if s is None:
        return target_row(target, backend, "-", None)
    ok = s["wall_s_max"] <= 2.0 and not s["statuses"].get("error", 0)
    return target_row(target, backend, f"max {s['wall_s_max']:.3f} s", ok)


def _grouping_targets(row: dict[str, Any]) -> list[dict[str, str]]:
    policy, n = str(row["policy"]), int(row["num_requests"])
    full = n >= GROUPING_TARGET_REQUESTS
    regroup = f"median {row['regroup_s_median']:.3f} s for {n:,} requests"
    add = f"median {row['add_us_median']:.1f} us, p99 {row['add_us_p99']:.1f} us"
    return [
        target_row(
            "grouping 100,000 requests <= 1 s",
            policy,
            regroup,
            row["regroup_s_median"] <= 1.0 if full else None,
        ),
        target_row("incremental insert <= 50 us", policy, add, row["add_us_median"] <= 50.0),
    ]
