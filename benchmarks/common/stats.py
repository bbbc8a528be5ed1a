"""Summary statistics the benchmarks report: nearest-rank percentiles (a measured value, never
an interpolation between two) and medians that tolerate no values."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by the nearest-rank method; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-q * len(ordered) // 1))  # ceil(q n), at least 1
    return ordered[min(len(ordered), int(rank)) - 1]


def percentile_or_nan(values: Sequence[float], q: float) -> float:
    """`percentile`, nan for no values (results files write it as null)."""
    found = percentile(values, q)
    return float("nan") if found is None else found


def median(values: Sequence[float]) -> float | None:
    """The median; None for no values."""
    return statistics.median(values) if values else None
