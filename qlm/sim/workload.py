"""Workloads: streams of requests with an arrival process, a rate shape, lengths and mixes.

A workload is a list of streams (`StreamConfig`). Each stream draws from its own random
generators, one per component (arrivals, lengths, models, classes), seeded from the scenario
seed and the component's name (`component_rng`), so adding or changing one stream or component
never shifts another's draws.

Arrival processes: ``poisson`` (exponential gaps), ``gamma`` (gamma gaps with a given
coefficient of variation; cv = 1 is Poisson, cv > 1 is bursty), ``trace`` (replay a trace's
timestamps, scaled in time) and ``backlog`` (all requests at the stream's start). Poisson and
gamma run at a rate that may change over time: a linear ramp and bursts (windows at k x rate).
A time-varying rate is applied by the time-change method: a unit-rate renewal process in
"operational time" y is mapped to t = L^-1(y), where L(t) is the integral of the rate.

Streams are generated in chunks and merged lazily (`iter_requests`), so a million requests
never need more than the request objects the caller keeps.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import numpy.typing as npt
from pydantic import AfterValidator, Field, model_validator

from qlm.config import StrictModel, resolve_relative
from qlm.sim.traces import TRACE_FORMATS, Trace, load_trace
from qlm.types import Request, SloClass

CHUNK = 65_536  # requests generated per step of a stream

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# --- seeded generators ----------------------------------------------------------------------


def component_rng(seed: int, component: str) -> np.random.Generator:
    """A generator for one named stochastic component: SeedSequence(seed) with a spawn key
    derived from the name (stable across runs and Python versions)."""
    digest = hashlib.blake2b(component.encode("utf-8"), digest_size=8).digest()
    key = int.from_bytes(digest, "little")
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(key,)))


# --- trace paths: resolved against the scenario file's folder (qlm.config.relative_to) ------


def _existing_file(path: Path) -> Path:
    full = resolve_relative(path)
    if not full.is_file():
        raise ValueError(f"file not found: {full}")
    return full


def _known_format(fmt: str) -> str:
    if fmt not in TRACE_FORMATS.names():
        raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(TRACE_FORMATS.names())}")
    return fmt


TracePath = Annotated[Path, AfterValidator(_existing_file)]
TraceFormat = Annotated[str, AfterValidator(_known_format)]


# --- arrival processes ----------------------------------------------------------------------


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


# --- lengths ---------------------------------------------------------------------------------


class TraceLengths(StrictModel):
    """Prompt and output lengths drawn jointly (one row at a time, with replacement) from a
    trace's rows, optionally restricted to prompts in [min_prompt_tokens, max_prompt_tokens]."""

    source: Literal["trace"]
    path: TracePath
    format: TraceFormat = "azure"
    min_prompt_tokens: int | None = Field(default=None, ge=1)
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1, description="Cap (clip).")


class FixedLengths(StrictModel):
    source: Literal["fixed"]
    prompt_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1)


class ReplayLengths(StrictModel):
    """The replayed trace rows' own lengths (trace arrivals only)."""

    source: Literal["replay"]
    max_output_tokens: int | None = Field(default=None, ge=1, description="Cap (clip).")


Lengths = Annotated[TraceLengths | FixedLengths | ReplayLengths, Field(discriminator="source")]


# --- a stream --------------------------------------------------------------------------------

Weights = Annotated[dict[str, Annotated[float, Field(gt=0)]], Field(min_length=1)]


class StreamConfig(StrictModel):
    """One stream of requests. Needs count or duration_s, except a trace replay (which ends
    with its trace)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="Id prefix.")
    arrivals: Arrivals
    start_s: float = Field(default=0.0, ge=0, description="When the stream begins.")
    count: int | None = Field(default=None, ge=1, le=100_000_000)
    duration_s: float | None = Field(default=None, gt=0)
    ramp: RampConfig | None = None
    bursts: tuple[BurstConfig, ...] = ()
    models: Weights = Field(description="Model name -> weight.")
    classes: Weights = Field(description="SLO class name -> weight.")
    lengths: Lengths | None = Field(default=None, description="Default: replay (traces only).")

    @model_validator(mode="after")
    def _consistent(self) -> StreamConfig:
        arrivals = self.arrivals
        shaped = self.ramp is not None or bool(self.bursts)
        if isinstance(arrivals, BacklogArrivals):
            if self.count is None:
                raise ValueError("a backlog needs count")
            if self.duration_s is not None or shaped:
                raise ValueError("a backlog takes no duration_s, ramp or bursts")
        elif isinstance(arrivals, TraceArrivals):
            if shaped:
                raise ValueError("trace arrivals take no ramp or bursts (use time_scale)")
        elif self.count is None and self.duration_s is None:
            raise ValueError("poisson and gamma streams need count or duration_s")
        if self.ramp is not None and self.ramp.end_s is None and self.duration_s is None:
            raise ValueError("ramp needs end_s or the stream's duration_s")
        if self.ramp is not None and self._ramp_end_s() <= self.ramp.start_s:
            raise ValueError("ramp must end after it starts")
        if self.lengths is None and not isinstance(arrivals, TraceArrivals):
            raise ValueError("lengths is required unless arrivals replay a trace")
        if isinstance(self.lengths, ReplayLengths) and not isinstance(arrivals, TraceArrivals):
            raise ValueError("lengths source 'replay' needs trace arrivals")
        return self

    def _ramp_end_s(self) -> float:
        assert self.ramp is not None
        end = self.ramp.end_s if self.ramp.end_s is not None else self.duration_s
        assert end is not None
        return end

    def with_rate_scale(self, factor: float) -> StreamConfig:
        """Rates x factor (trace times / factor); a backlog is unchanged."""
        arrivals = self.arrivals
        update: dict[str, object] = {}
        if isinstance(arrivals, PoissonArrivals | GammaArrivals):
            update["arrivals"] = arrivals.model_copy(
                update={"rate_per_s": arrivals.rate_per_s * factor}
            )
            if self.ramp is not None:
                update["ramp"] = self.ramp.model_copy(
                    update={"to_rate_per_s": self.ramp.to_rate_per_s * factor}
                )
        elif isinstance(arrivals, TraceArrivals):
            update["arrivals"] = arrivals.model_copy(
                update={"time_scale": arrivals.time_scale / factor}
            )
        return self.model_copy(update=update)

    def rate_profile(self) -> RateProfile:
        arrivals = self.arrivals
        assert isinstance(arrivals, PoissonArrivals | GammaArrivals)
        ramp = None
        if self.ramp is not None:
            ramp = (self.ramp.start_s, self._ramp_end_s(), self.ramp.to_rate_per_s)
        bursts = tuple((b.start_s, b.start_s + b.duration_s, b.factor) for b in self.bursts)
        return RateProfile.build(arrivals.rate_per_s, ramp, bursts)


# --- time-varying rates ----------------------------------------------------------------------


@dataclass(frozen=True)
class RateProfile:
    """A piecewise-linear rate: segment i runs from starts_s[i] to starts_s[i+1] (the last one
    forever), with rate moving linearly from rate_from[i] to rate_to[i] (equal in the last)."""

    starts_s: tuple[float, ...]
    rate_from: tuple[float, ...]
    rate_to: tuple[float, ...]

    @classmethod
    def build(
        cls,
        rate_per_s: float,
        ramp: tuple[float, float, float] | None = None,
        bursts: Sequence[tuple[float, float, float]] = (),
    ) -> RateProfile:
        """rate_per_s, with an optional ramp (start_s, end_s, to_rate_per_s) and bursts
        (start_s, end_s, factor); overlapping bursts multiply."""
        points = {0.0}
        if ramp is not None:
            points |= {ramp[0], ramp[1]}
        for start, end, _ in bursts:
            points |= {start, end}
        starts = sorted(points)

        def base(t: float) -> float:
            if ramp is None or t <= ramp[0]:
                return rate_per_s
            if t >= ramp[1]:
                return ramp[2]
            return rate_per_s + (ramp[2] - rate_per_s) * (t - ramp[0]) / (ramp[1] - ramp[0])

        def factor(t: float) -> float:
            return math.prod(k for s, e, k in bursts if s <= t < e)

        rate_from: list[float] = []
        rate_to: list[float] = []
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else start  # the last is constant
            k = factor(start)
            rate_from.append(base(start) * k)
            rate_to.append(base(end) * k)
        return cls(tuple(starts), tuple(rate_from), tuple(rate_to))

    def rate_at(self, t_s: float) -> float:
        i = max(0, bisect.bisect_right(self.starts_s, t_s) - 1)
        if i + 1 >= len(self.starts_s):
            return self.rate_from[i]
        frac = (t_s - self.starts_s[i]) / (self.starts_s[i + 1] - self.starts_s[i])
        return self.rate_from[i] + (self.rate_to[i] - self.rate_from[i]) * frac

    def _cumulative_at_starts(self) -> list[float]:
        out = [0.0]
        for i in range(len(self.starts_s) - 1):
            length = self.starts_s[i + 1] - self.starts_s[i]
            out.append(out[-1] + 0.5 * (self.rate_from[i] + self.rate_to[i]) * length)
        return out

    def cumulative(self, t_s: float) -> float:
        """Expected arrivals in [0, t_s]."""
        cum = self._cumulative_at_starts()
        i = max(0, bisect.bisect_right(self.starts_s, t_s) - 1)
        x = t_s - self.starts_s[i]
        r0 = self.rate_from[i]
        slope = 0.0
        if i + 1 < len(self.starts_s):
            slope = (self.rate_to[i] - r0) / (self.starts_s[i + 1] - self.starts_s[i])
        return cum[i] + r0 * x + 0.5 * slope * x * x

    def inverse(self, y: FloatArray) -> FloatArray:
        """Times t with cumulative(t) = y (y non-decreasing); inf where the rate has dropped
        to zero for good before reaching y."""
        cum = np.asarray(self._cumulative_at_starts())
        seg = np.maximum(0, np.searchsorted(cum, y, side="left") - 1)
        out = np.empty_like(y)
        starts = np.asarray(self.starts_s)
        last = len(self.starts_s) - 1
        for i in np.unique(seg):
            mask = seg == i
            dy = y[mask] - cum[i]
            r0 = self.rate_from[i]
            if i == last:
                out[mask] = starts[i] + (dy / r0 if r0 > 0 else np.where(dy > 0, np.inf, 0.0))
                continue
            length = starts[i + 1] - starts[i]
            half_slope = (self.rate_to[i] - r0) / (2.0 * length)
            # r0 x + half_slope x^2 = dy, solved in the cancellation-free form
            root = np.sqrt(np.maximum(0.0, r0 * r0 + 4.0 * half_slope * dy))
            with np.errstate(divide="ignore", invalid="ignore"):
                x = np.where(r0 + root > 0, 2.0 * dy / (r0 + root), 0.0)
            out[mask] = starts[i] + np.minimum(x, length)
        return out


# --- generation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamChunk:
    """Up to CHUNK consecutive requests of one stream, as columns."""

    first_index: int
    arrival_s: FloatArray  # absolute (stream start included)
    prompt_tokens: IntArray
    output_tokens: IntArray
    model_index: IntArray
    class_index: IntArray


def _unit_gaps(spec: StreamConfig, rng: np.random.Generator, n: int) -> FloatArray:
    arrivals = spec.arrivals
    if isinstance(arrivals, GammaArrivals):
        shape = 1.0 / (arrivals.cv * arrivals.cv)
        return rng.gamma(shape, 1.0 / shape, n)
    return rng.exponential(1.0, n)


def _renewal_times(spec: StreamConfig, seed: int) -> Iterator[FloatArray]:
    """Arrival times relative to the stream's start, chunk by chunk, unbounded."""
    rng = component_rng(seed, f"{spec.name}/arrivals")
    profile = spec.rate_profile()
    y = 0.0
    while True:
        ops = y + np.cumsum(_unit_gaps(spec, rng, CHUNK))
        y = float(ops[-1])
        times = profile.inverse(ops)
        finite = times[np.isfinite(times)]
        if len(finite):
            yield finite
        if len(finite) < len(times):
            return


def _trace_rows(spec: StreamConfig) -> tuple[Trace, int]:
    arrivals = spec.arrivals
    assert isinstance(arrivals, TraceArrivals)
    trace = load_trace(arrivals.path, arrivals.format)
    first = int(np.searchsorted(trace.arrival_s, arrivals.offset_s, side="left"))
    return trace, first


def _trace_times(spec: StreamConfig) -> Iterator[FloatArray]:
    arrivals = spec.arrivals
    assert isinstance(arrivals, TraceArrivals)
    trace, first = _trace_rows(spec)
    times = (trace.arrival_s[first:] - arrivals.offset_s) * arrivals.time_scale
    for i in range(0, len(times), CHUNK):
        yield times[i : i + CHUNK]


def _arrival_times(spec: StreamConfig, seed: int) -> Iterator[FloatArray]:
    """Arrival times relative to the stream's start, cut at count and duration_s."""
    arrivals = spec.arrivals
    if isinstance(arrivals, BacklogArrivals):
        assert spec.count is not None
        source: Iterator[FloatArray] = (
            np.zeros(min(CHUNK, spec.count - i)) for i in range(0, spec.count, CHUNK)
        )
    elif isinstance(arrivals, TraceArrivals):
        source = _trace_times(spec)
    else:
        source = _renewal_times(spec, seed)
    left = spec.count if spec.count is not None else math.inf
    for chunk in source:
        times = chunk if spec.duration_s is None else chunk[chunk < spec.duration_s]
        times = times[: int(min(left, len(times)))]
        if len(times):
            yield times
            left -= len(times)
        if left <= 0 or len(times) < len(chunk):
            return


class _LengthSampler:
    """Draws (prompt, output) lengths for one stream from its own generator."""

    def __init__(self, spec: StreamConfig, seed: int) -> None:
        self.spec = spec
        self.lengths = spec.lengths if spec.lengths is not None else ReplayLengths(source="replay")
        self.rng = component_rng(seed, f"{spec.name}/lengths")
        self.next_row = 0
        self.rows: Trace | None = None
        if isinstance(self.lengths, TraceLengths):
            trace = load_trace(self.lengths.path, self.lengths.format)
            self.rows = trace.where_prompt(
                self.lengths.min_prompt_tokens, self.lengths.max_prompt_tokens
            )
        elif isinstance(self.lengths, ReplayLengths):
            self.rows, self.next_row = _trace_rows(spec)

    def draw(self, n: int) -> tuple[IntArray, IntArray]:
        lengths = self.lengths
        if isinstance(lengths, FixedLengths):
            return (
                np.full(n, lengths.prompt_tokens, dtype=np.int64),
                np.full(n, lengths.output_tokens, dtype=np.int64),
            )
        assert self.rows is not None
        if isinstance(lengths, ReplayLengths):
            idx = np.arange(self.next_row, self.next_row + n)
            self.next_row += n
        else:
            idx = self.rng.integers(0, len(self.rows), n)
        prompts, outputs = self.rows.prompt_tokens[idx], self.rows.output_tokens[idx]
        cap = lengths.max_output_tokens
        return prompts, (np.minimum(outputs, cap) if cap is not None else outputs)


def _categorical(rng: np.random.Generator, weights: Mapping[str, float], n: int) -> IntArray:
    if len(weights) == 1:
        return np.zeros(n, dtype=np.int64)
    p = np.asarray(list(weights.values()), dtype=np.float64)
    return rng.choice(len(p), size=n, p=p / p.sum()).astype(np.int64)


def stream_chunks(spec: StreamConfig, seed: int) -> Iterator[StreamChunk]:
    """The stream's requests, in arrival order, CHUNK at a time."""
    lengths = _LengthSampler(spec, seed)
    models_rng = component_rng(seed, f"{spec.name}/models")
    classes_rng = component_rng(seed, f"{spec.name}/classes")
    index = 0
    for times in _arrival_times(spec, seed):
        n = len(times)
        prompts, outputs = lengths.draw(n)
        yield StreamChunk(
            index,
            times + spec.start_s,
            prompts,
            outputs,
            _categorical(models_rng, spec.models, n),
            _categorical(classes_rng, spec.classes, n),
        )
        index += n


def stream_requests(
    spec: StreamConfig, seed: int, slo_classes: Mapping[str, SloClass]
) -> Iterator[Request]:
    models = list(spec.models)
    classes = [slo_classes[c] for c in spec.classes]
    for chunk in stream_chunks(spec, seed):
        for k, (t, p, o, m, c) in enumerate(
            zip(
                chunk.arrival_s.tolist(),
                chunk.prompt_tokens.tolist(),
                chunk.output_tokens.tolist(),
                chunk.model_index.tolist(),
                chunk.class_index.tolist(),
                strict=True,
            )
        ):
            yield Request.create(
                f"{spec.name}-{chunk.first_index + k}", models[m], p, o, classes[c], t
            )


def iter_requests(
    streams: Sequence[StreamConfig],
    seed: int,
    slo_classes: Mapping[str, SloClass],
    horizon_s: float | None = None,
) -> Iterator[Request]:
    """All streams merged in arrival order (ties: the earlier stream, then its order), each
    request's max_output_tokens its true output length; arrivals at or after horizon_s are
    dropped."""
    merged = heapq.merge(
        *(stream_requests(s, seed, slo_classes) for s in streams),
        key=lambda r: r.arrival_at_s,
    )
    for request in merged:
        if horizon_s is not None and request.arrival_at_s >= horizon_s:
            return
        yield request
