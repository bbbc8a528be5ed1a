"""benchmarks/timing_mean.py: the seeds it reads, and the comparison it prints."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.timing_mean import seeds_of, summary, table


def test_seeds_are_read_as_ranges_and_lists() -> None:
    assert seeds_of("0-3") == [0, 1, 2, 3]
    assert seeds_of("3,5,9-10") == [3, 5, 9, 10]
    with pytest.raises(argparse.ArgumentTypeError, match="'x' is not a seed"):
        seeds_of("3,x")


def test_the_comparison_is_the_difference_of_the_means_per_case() -> None:
    def case(name: str, tier: int, overall: list[float], swaps: list[int]) -> dict[str, object]:
        mean = sum(overall) / len(overall)
        return {
            "case": name,
            "tier": tier,
            "overall_pct": overall,
            "mean_pct": mean,
            "swaps": swaps,
        }

    cases = [case("many:3", 1, [90.0, 92.0], [4, 6]), case("many:5", 2, [80.0, 80.0], [3, 3])]
    before = {"many:3": 85.0, "many:5": 80.5}
    rows = table(cases, before)
    assert rows[2].endswith("| 91.00 | 4-6 | 85.00 | +6.00 |")
    assert rows[3].endswith("| 80.50 | -0.50 |")
    lines = summary(cases, before)
    assert lines[0] == "Mean over 2 cases: 85.50 %."
    assert "+2.75 points on average over 2 cases (1 up, 1 down" in lines[1]
    assert table(cases, {})[0].count("|") == 6  # no comparison columns without a baseline
