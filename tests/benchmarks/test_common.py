"""benchmarks/common/: nearest-rank percentiles and medians, the Markdown tables and target
rows the benchmarks share."""

from __future__ import annotations

from benchmarks.common.stats import median, percentile, percentile_or_nan
from benchmarks.common.tables import markdown_table, target_row


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.99) is None
    nan = percentile_or_nan([], 0.5)
    assert nan != nan
    assert percentile_or_nan(values, 0.5) == 50.0


def test_median_of_nothing_is_none() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([]) is None


def test_table_formats_every_cell_by_its_column() -> None:
    rows = [{"a": 1.5, "b": None}, {"a": 2.0}]
    table = markdown_table(rows, ("a", "b"), lambda v, c: "-" if v is None else f"{c}={v}")
    assert table == "| a | b |\n|---|---|\n| a=1.5 | - |\n| a=2.0 | - |"


def test_target_row_says_pass_miss_or_not_run() -> None:
    assert target_row("t", "s", "m", True)["result"] == "PASS"
    assert target_row("t", "s", "m", False)["result"] == "MISS"
    assert target_row("t", "s", "-", None) == {
        "target": "t",
        "subject": "s",
        "measured": "-",
        "result": "not run",
    }
