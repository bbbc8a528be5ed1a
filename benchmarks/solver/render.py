"""The solver block of docs/benchmarks.md (also printed): the header, the targets, the planner
table and the grouping table."""

from __future__ import annotations

from typing import Any

from benchmarks.common.tables import markdown_table
from benchmarks.report import header_lines

TARGETS = (
    "100 x 16 in <= 1 s at the median with objective no worse than EDF; 200 x 32 honours a "
    "2 s limit; grouping 100,000 requests <= 1 s; incremental insert <= 50 us"
)


def _fmt(value: object, column: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and column.startswith("ratio"):
        return f"{value:.4f}"  # 0.99995 is an improvement, not "1"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in sorted(value.items()))
    return str(value)


PLANNER_COLUMNS = (
    "case", "planner", "time_limit_s", "runs", "wall_s_median", "wall_s_max",
    "solve_wall_s_median", "ratio_median", "ratio_max", "no_worse_than_edf", "better_than_edf",
    "statuses", "swaps_median", "late_groups_median",
)  # fmt: skip
GROUPING_COLUMNS = (
    "policy", "num_requests", "num_groups", "regroup_s_median", "regroup_s_max",
    "add_us_median", "add_us_p99", "max_group_size",
)  # fmt: skip


def render(report: dict[str, Any]) -> str:
    grouping = report["grouping"]
    parts = [
        "## Planner and grouping benchmark",
        "",
        *header_lines(report),
        "",
        f"Targets: {TARGETS}.",
        "",
        markdown_table(report["targets"], ("target", "subject", "measured", "result"), _fmt),
        "",
        "### Planner: MILP backends against EDF",
        "",
        "wall_s: measured around `plan()` (perf_counter); solve_wall_s: `Plan.solve_wall_s`; "
        "ratio: MILP objective / EDF objective on the same input (lower is better, <= 1 is "
        "no worse); statuses count runs; swaps and late groups are medians per plan. "
        f"Planner config otherwise default ({report['planner_defaults']}).",
        "",
        markdown_table(report["summaries"], PLANNER_COLUMNS, _fmt),
        "",
        "### Grouping",
        "",
        grouping if isinstance(grouping, str) else markdown_table(grouping, GROUPING_COLUMNS, _fmt),
    ]
    return "\n".join(parts)
