"""When do a stream's requests arrive?

Four processes: ``poisson`` (exponential gaps), ``gamma`` (gamma gaps with a given coefficient
of variation; cv = 1 is Poisson, cv > 1 is bursty), ``trace`` (replay a trace's timestamps,
scaled in time) and ``backlog`` (every request at the stream's start). Poisson and gamma run
at a rate that may change over time (a linear ramp, bursts at k x rate), applied by the
time-change method of qlm/sim/workload/rates.py. Times are generated CHUNK at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from qlm.config import StrictModel
from qlm.sim.traces import Trace, load_trace
from qlm.sim.workload.paths import TraceFormat, TracePath
from qlm.sim.workload.rates import FloatArray, RateProfile

CHUNK = 65_536  # requests generated per step of a stream


class PoissonArrivals(StrictModel):
    process: Literal["poisson"]
    rate_per_s: float = Field(gt=0, description="Mean arrivals per second (before ramp/bursts).")


class GammaArrivals(StrictModel):
    process: Literal["gamma"]
    rate_per_s: float = Field(gt=0, description="Mean arrivals per second (before ramp/bursts).")
    cv: float = Field(gt=0, le=100, description="Coefficient of variation of the gaps.")


class TraceArrivals(StrictModel):
    process: Literal["trace"]
    path: TracePath = Field(description="Trace file, relative to the scenario file.")
    format: TraceFormat = Field(default="azure", description="azure, mooncake or vidur.")
    time_scale: float = Field(
        default=1.0, gt=0, description="Multiplies the trace's times (0.5 = twice the rate)."
    )
    offset_s: float = Field(default=0.0, ge=0, description="Skip the trace's first seconds.")


class BacklogArrivals(StrictModel):
    process: Literal["backlog"]


Arrivals = Annotated[
    PoissonArrivals | GammaArrivals | TraceArrivals | BacklogArrivals,
    Field(discriminator="process"),
]


class RampConfig(StrictModel):
    """The rate changes linearly from the stream's rate to to_rate_per_s between start_s and
    end_s (relative to the stream's start); constant before and after."""

    to_rate_per_s: float = Field(ge=0)
    start_s: float = Field(default=0.0, ge=0)
    end_s: float | None = Field(default=None, gt=0, description="Default: the stream's end.")


class BurstConfig(StrictModel):
    """For duration_s from start_s (relative to the stream's start) the rate is factor x."""

    start_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)
    factor: float = Field(gt=0)


def arrival_times(
    arrivals: PoissonArrivals | GammaArrivals | TraceArrivals | BacklogArrivals,
    count: int | None,
    duration_s: float | None,
    rate_profile: Callable[[], RateProfile],
    rng: np.random.Generator,
) -> Iterator[FloatArray]:
    """Arrival times relative to the stream's start, chunk by chunk, cut at count and
    duration_s. `rate_profile` and `rng` serve the renewal processes (poisson, gamma)."""
    if isinstance(arrivals, BacklogArrivals):
        assert count is not None
        source: Iterator[FloatArray] = (
            np.zeros(min(CHUNK, count - i)) for i in range(0, count, CHUNK)
        )
    elif isinstance(arrivals, TraceArrivals):
        source = _trace_times(arrivals)
    else:
        source = _renewal_times(arrivals, rate_profile(), rng)
    left = count if count is not None else math.inf
    for chunk in source:
        times = chunk if duration_s is None else chunk[chunk < duration_s]
        times = times[: int(min(left, len(times)))]
        if len(times):
            yield times
            left -= len(times)
        if left <= 0 or len(times) < len(chunk):
            return


def trace_rows(arrivals: TraceArrivals) -> tuple[Trace, int]:
    """The trace and the index of its first row at or after offset_s."""
    trace = load_trace(arrivals.path, arrivals.format)
    first = int(np.searchsorted(trace.arrival_s, arrivals.offset_s, side="left"))
    return trace, first


def _trace_times(arrivals: TraceArrivals) -> Iterator[FloatArray]:
    trace, first = trace_rows(arrivals)
    times = (trace.arrival_s[first:] - arrivals.offset_s) * arrivals.time_scale
    for i in range(0, len(times), CHUNK):
        yield times[i : i + CHUNK]


def _unit_gaps(
    arrivals: PoissonArrivals | GammaArrivals, rng: np.random.Generator, n: int
) -> FloatArray:
    if isinstance(arrivals, GammaArrivals):
        shape = 1.0 / (arrivals.cv * arrivals.cv)
        return rng.gamma(shape, 1.0 / shape, n)
    return rng.exponential(1.0, n)


def _renewal_times(
    arrivals: PoissonArrivals | GammaArrivals, profile: RateProfile, rng: np.random.Generator
) -> Iterator[FloatArray]:
    """Arrival times relative to the stream's start, chunk by chunk, unbounded: unit-rate
    gaps in operational time, mapped to real time by the profile's inverse."""
    y = 0.0
    while True:
        ops = y + np.cumsum(_unit_gaps(arrivals, rng, CHUNK))
        y = float(ops[-1])
        times = profile.inverse(ops)
        finite = times[np.isfinite(times)]
        if len(finite):
            yield finite
        if len(finite) < len(times):
            return
