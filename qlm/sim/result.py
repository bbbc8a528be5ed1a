"""What a simulation run returns: per-request outcomes and fleet-level records, frozen, with
the summary figures capacity planners read (SLO attainment, throughput, goodput, TTFT).

Time fields are seconds on the simulation's virtual clock. `sim_wall_s` and `planner_wall_s`
are the only wall-clock measurements; `canonical_json()` leaves them out, so two runs with the
same inputs and seed compare byte for byte.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import numpy as np


class OutcomeState(StrEnum):
    COMPLETED = "completed"  # produced all its output
    FAILED = "failed"  # an engine dropped it on its own (e.g. it can never fit)
    UNFINISHED = "unfinished"  # the run stopped (max time) before it ended


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One request's fate.

    dispatch_s and instance_id belong to the attempt that ended the request (after evictions,
    the last one); first_token_s is the first token the client saw, from whichever attempt
    produced it first (a requeued stream resumes rather than restarts, see qlm/queue).

    What the runner saw of its wait, for the miss causes (qlm/sim/miss_causes.py): queue_wait_s is
    the time in the global queue before its first token (until the run ended, if it never got
    one), summed over its waits; no_model_wait_s and load_wait_s are the parts of it while no
    instance had its model loaded or loading, and while some instance was loading it and none
    had it loaded. interrupted_s is when an engine first let it go (an eviction or an abort).
    """

    request_id: str
    slo_class: str
    model: str
    instance_id: str | None
    arrival_s: float
    dispatch_s: float | None
    first_token_s: float | None
    finish_s: float | None
    ttft_deadline_s: float
    completion_deadline_s: float | None
    evictions: int
    state: OutcomeState
    queue_wait_s: float = 0.0
    no_model_wait_s: float = 0.0
    load_wait_s: float = 0.0
    interrupted_s: float | None = None
    output_tokens: int | None = None  # tokens it made in all (completed requests)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def met_slo(self) -> bool:
        """Finished, first token by its TTFT deadline, and done by its completion deadline if
        it has one."""
        if self.state is not OutcomeState.COMPLETED or self.first_token_s is None:
            return False
        if self.first_token_s > self.ttft_deadline_s:
            return False
        deadline = self.completion_deadline_s
        return deadline is None or (self.finish_s is not None and self.finish_s <= deadline)


@dataclass(frozen=True, slots=True)
class Attempt:
    """A stretch of a request on an instance that did not end it (evicted or swapped away)."""

    request_id: str
    instance_id: str
    dispatch_s: float
    end_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class LoadInterval:
    """An instance loading a model: it serves nothing from start_s to end_s."""

    instance_id: str
    model: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class TtftPrediction:
    """What a policy predicted, when a request arrived, its time to first token would be
    (None: that it would miss), with the request's prompt length (accuracy is reported by
    prompt-length band) and the bound it gave for nine requests in ten (`upper_s`,
    qlm/estimator/forecast_band.py; None: none yet)."""

    predicted_s: float | None
    prompt_tokens: int
    upper_s: float | None = None


@dataclass(frozen=True, slots=True)
class QueueSample:
    """Requests waiting at at_s (arrived, not producing tokens: in the global queue or admitted
    to an engine but not started), by SLO class in the order of SimResult.slo_classes."""

    at_s: float
    waiting: tuple[int, ...]


@dataclass(frozen=True)
class SimResult:
    policy: str
    seed: int
    slo_classes: tuple[str, ...]
    outcomes: tuple[RequestOutcome, ...]  # in arrival order
    interrupted: tuple[Attempt, ...]
    loads: tuple[LoadInterval, ...]
    swaps: Mapping[str, int]  # model loads per instance during the run
    evictions: int
    queue_samples: tuple[QueueSample, ...]
    events_processed: int
    start_s: float
    end_s: float
    sim_wall_s: float
    policy_stats: Mapping[str, float] = field(default_factory=dict)  # deterministic counters
    planner_wall_s: float = 0.0  # wall time spent inside the policy's planner, if any
    # Per request, the TTFT the policy predicted at arrival (None: predicted to miss).
    ttft_predictions: Mapping[str, TtftPrediction] = field(default_factory=dict)
    # Per instance, (prompt tokens admitted with a prefix, of them found in its prefix cache).
    prefix_tokens: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "swaps", MappingProxyType(dict(self.swaps)))
        object.__setattr__(self, "policy_stats", MappingProxyType(dict(self.policy_stats)))
        predictions = MappingProxyType(dict(self.ttft_predictions))
        object.__setattr__(self, "ttft_predictions", predictions)
        object.__setattr__(self, "prefix_tokens", MappingProxyType(dict(self.prefix_tokens)))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with plain dicts (a read-only view cannot be pickled; the constructor
        makes them read-only again): results cross process and machine boundaries when runs
        are spread over a Ray cluster (qlm/sim/spread.py)."""
        values = (getattr(self, f.name) for f in fields(self))
        return SimResult, tuple(dict(v) if isinstance(v, MappingProxyType) else v for v in values)

    def prefix_reuse(self) -> dict[str, Any] | None:
        """Prompt tokens served from the engines' prefix caches over the prompt tokens of
        prefixed admissions (a recomputed request counts again), overall and per instance;
        None when no request carried a prefix."""
        prompt = sum(p for p, _ in self.prefix_tokens.values())
        if not prompt:
            return None
        hit = sum(h for _, h in self.prefix_tokens.values())
        return {
            "prompt_tokens": prompt,
            "hit_tokens": hit,
            "reuse": hit / prompt,
            "by_instance": {i: h / p if p else 0.0 for i, (p, h) in self.prefix_tokens.items()},
        }

    @property
    def num_requests(self) -> int:
        return len(self.outcomes)

    @property
    def duration_s(self) -> float:
        """From the first arrival to the last event."""
        return max(0.0, self.end_s - self.start_s)

    @property
    def total_swaps(self) -> int:
        return sum(self.swaps.values())

    @property
    def completed(self) -> int:
        return sum(o.state is OutcomeState.COMPLETED for o in self.outcomes)

    def attainment(self, slo_class: str | None = None) -> float:
        """Share of requests (of one class, or all) that met their SLO; 1.0 when none."""
        chosen = [o for o in self.outcomes if slo_class is None or o.slo_class == slo_class]
        return _share(o.met_slo for o in chosen) if chosen else 1.0

    def attainment_by_class(self) -> dict[str, float]:
        present = {o.slo_class for o in self.outcomes}
        return {c: self.attainment(c) for c in self.slo_classes if c in present}

    @property
    def throughput_rps(self) -> float:
        """Completed requests per second over the run."""
        return _rate(self.completed, self.duration_s)

    @property
    def goodput_rps(self) -> float:
        """Requests that met their SLO, per second over the run."""
        return _rate(sum(o.met_slo for o in self.outcomes), self.duration_s)

    def ttft_quantile_s(self, q: float) -> float:
        """TTFT quantile over requests that produced a first token (NaN when none did)."""
        ttfts = [o.ttft_s for o in self.outcomes if o.ttft_s is not None]
        if not ttfts:
            return math.nan
        return float(np.quantile(np.asarray(ttfts, dtype=np.float64), q))

    @property
    def ttft_p50_s(self) -> float:
        return self.ttft_quantile_s(0.5)

    @property
    def ttft_p99_s(self) -> float:
        return self.ttft_quantile_s(0.99)

    def tbt_quantile_ms(self, q: float) -> float:
        """Time between tokens (ms): a completed request's decode time over the tokens after
        its first, its quantile over those that made two or more (NaN when none did)."""
        tbts = [
            1e3 * (o.finish_s - o.first_token_s) / (o.output_tokens - 1)
            for o in self.outcomes
            if o.output_tokens is not None and o.output_tokens > 1
            if o.finish_s is not None and o.first_token_s is not None
        ]
        if not tbts:
            return math.nan
        return float(np.quantile(np.asarray(tbts, dtype=np.float64), q))

    def summary(self) -> dict[str, Any]:
        """One policy's entry in summary.json (README: the summary format), less its miss
        causes (qlm.sim.report.summary.policy_summary adds them)."""
        return {
            "requests": self.num_requests,
            "slo_attainment": {"overall": self.attainment(), **self.attainment_by_class()},
            "throughput_rps": self.throughput_rps,
            "goodput_rps": self.goodput_rps,
            "ttft_p50_s": self.ttft_p50_s,
            "ttft_p99_s": self.ttft_p99_s,
            "tbt_p50_ms": self.tbt_quantile_ms(0.5),
            "tbt_p99_ms": self.tbt_quantile_ms(0.99),
            "swaps": self.total_swaps,
            "evictions": self.evictions,
            "sim_wall_s": self.sim_wall_s,
        }

    @property
    def events_per_s(self) -> float:
        """Events processed per wall second."""
        return _rate(self.events_processed, self.sim_wall_s)

    def canonical_json(self) -> str:
        """Everything the run decided, without wall-clock measurements: equal for equal
        inputs and seed."""
        data = {
            "policy": self.policy,
            "seed": self.seed,
            "slo_classes": list(self.slo_classes),
            "outcomes": [_row(o) for o in self.outcomes],
            "interrupted": [asdict(a) for a in self.interrupted],
            "loads": [asdict(x) for x in self.loads],
            "swaps": dict(sorted(self.swaps.items())),
            "evictions": self.evictions,
            "queue_samples": [[s.at_s, list(s.waiting)] for s in self.queue_samples],
            "events_processed": self.events_processed,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "policy_stats": dict(sorted(self.policy_stats.items())),
        }
        return json.dumps(data, separators=(",", ":"), allow_nan=True)


def _row(o: RequestOutcome) -> dict[str, Any]:
    row = asdict(o)
    row["state"] = str(o.state)
    return row


def _share(flags: Iterable[bool]) -> float:
    values = list(flags)
    return sum(values) / len(values) if values else 1.0


def _rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0
