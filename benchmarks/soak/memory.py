"""Does the plane's resident memory stay flat? Each process's RSS sampled over the run, with the
client's concurrency peaks beside it, and a least-squares slope after the warm-up."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import psutil

from benchmarks.soak.load import LoadStats

MIB = 1024 * 1024
WARMUP_SHARE = 0.2  # the slope leaves out the first 20 % of the run (imports, caches, pools)
FLAT_MIB = 10.0  # growth after warm-up a healthy process may show over the run (allocator noise)
IN_FLIGHT = "in_flight_peak"  # key of the client's concurrency in the memory samples


def rss_mib(pid: int) -> float | None:
    """Resident set size of a process and its children (a vLLM server would be one)."""
    try:
        proc = psutil.Process(pid)
        total = proc.memory_info().rss
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
    except psutil.Error:
        return None
    return total / MIB


async def sample_memory(
    pids: dict[str, int],
    every_s: float,
    t0: float,
    out: list[dict[str, Any]],
    stop: asyncio.Event,
    stats: LoadStats,
) -> None:
    """RSS of each process every every_s, with the most requests the client had open at
    once since the previous sample (memory high-water marks follow concurrency peaks)."""
    while not stop.is_set():
        row: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 1)}
        for role, pid in pids.items():
            value = rss_mib(pid)
            row[role] = None if value is None else round(value, 2)
        row[IN_FLIGHT] = stats.in_flight_peak
        stats.in_flight_peak = stats.in_flight
        out.append(row)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def slope_mib_per_hour(times_s: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of values over time, per hour."""
    n = len(times_s)
    if n < 2:
        return 0.0
    mean_t, mean_v = sum(times_s) / n, sum(values) / n
    var = sum((t - mean_t) ** 2 for t in times_s)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in zip(times_s, values, strict=True))
    return cov / var * 3600.0


def memory_summary(samples: Sequence[dict[str, Any]], duration_s: float) -> dict[str, Any]:
    """Per process: RSS at start, after warm-up and at the end; the slope after warm-up; and
    whether it stayed flat (the fitted growth over the rest of the run within FLAT_MIB)."""
    roles = [k for k in samples[0] if k not in ("t_s", IN_FLIGHT)] if samples else []
    warm_s = WARMUP_SHARE * duration_s
    summary: dict[str, Any] = {}
    for role in roles:
        points = [(s["t_s"], s[role]) for s in samples if s.get(role) is not None]
        after = [(t, v) for t, v in points if t >= warm_s] or points
        slope = slope_mib_per_hour([t for t, _ in after], [v for _, v in after])
        span_s = after[-1][0] - after[0][0] if after else 0.0
        growth = slope * span_s / 3600.0
        summary[role] = {
            "start_mib": points[0][1] if points else None,
            "after_warmup_mib": after[0][1] if after else None,
            "end_mib": points[-1][1] if points else None,
            "peak_mib": max(v for _, v in points) if points else None,
            "slope_mib_per_hour": round(slope, 2),
            "fitted_growth_mib": round(growth, 2),
            "flat": abs(growth) <= FLAT_MIB,
        }
    return summary


def memory_rows(samples: Sequence[dict[str, Any]], rows: int = 11) -> list[dict[str, Any]]:
    """About `rows` samples spread evenly over the run, first and last included."""
    if len(samples) <= rows:
        return list(samples)
    step = (len(samples) - 1) / (rows - 1)
    return [samples[round(k * step)] for k in range(rows)]
