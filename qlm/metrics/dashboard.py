"""What GET /dashboard/data returns: attainment per class (now and over time), queue by class,
instances with their model, state and prefix-cache reuse, recent swaps and evictions,
predicted against actual waits, planner outcomes, missed requests by cause
(qlm/causes/live.py).

`build_view` is pure: readings (qlm/metrics/readings.py) in, a JSON-ready dict out. Two sources
supply the readings: the process's own registry (`LocalSource`, the default) and a Prometheus
that scrapes every replica (`PrometheusSource`, qlm/metrics/prometheus.py). A view is cached
for `sample_every_s`, so many open pages cost one read per second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from qlm.clock import Clock
from qlm.metrics.history import EVALUATED, MET, QUEUE, HistoryPoint
from qlm.metrics.hooks import PlaneEvent
from qlm.metrics.readings import Reading, Series, by_first, read_registry
from qlm.metrics.recorder import PlaneMetrics

BY_CLASS_MODEL = ("slo_class", "model_name")
MET_BY_MODEL = Reading("qlm_slo_met_total", BY_CLASS_MODEL)
EVALUATED_BY_MODEL = Reading("qlm_slo_evaluated_total", BY_CLASS_MODEL)
TARGET = Reading("qlm_slo_attainment_target", ("slo_class",), "max")
GROUPS = Reading("qlm_request_groups", ("slo_class",))
OUTCOMES = Reading("qlm_requests_total", ("slo_class", "outcome"))
MISSED = Reading("qlm_slo_missed_total", ("slo_class", "cause"))
STATE = Reading("qlm_instance_state", ("instance_id", "state", "model_name"), "max")
RUNNING = Reading("qlm_instance_running_requests", ("instance_id",), "max")
KV = Reading("qlm_instance_kv_utilization_ratio", ("instance_id",), "max")
BUSY = Reading("qlm_instance_busy_seconds", ("instance_id",), "max")
SWAPS = Reading("qlm_model_swaps_total", ("instance_id",))
EVICTIONS = Reading("qlm_evictions_total", ("instance_id",))
RUNS = Reading("qlm_planner_runs_total", ("status",))
PREFIX_PROMPT = Reading("qlm_prefix_prompt_tokens_total", ("instance_id",))
PREFIX_HIT = Reading("qlm_prefix_hit_tokens_total", ("instance_id",))
# Predicted (at admission) against actual time to first token, over the same requests: both
# are observed when a request completes (`*_n` counts them).
WAIT_HISTOGRAMS = {
    "predicted": "qlm_wait_estimated_seconds",
    "actual": "qlm_request_ttft_seconds",
    "error": "qlm_wait_estimate_error_seconds",
}
WAITS = {
    (key, part): Reading(f"{name}_{part}", ("slo_class",))
    for key, name in WAIT_HISTOGRAMS.items()
    for part in ("sum", "count")
}
SOLVE_SUM = Reading("qlm_planner_solve_seconds_sum", ())
SOLVE_COUNT = Reading("qlm_planner_solve_seconds_count", ())
READINGS: tuple[Reading, ...] = (
    *(MET, EVALUATED, QUEUE, MET_BY_MODEL, EVALUATED_BY_MODEL, TARGET, GROUPS, OUTCOMES, MISSED),
    *(STATE, RUNNING, KV, BUSY, SWAPS, EVICTIONS, RUNS, SOLVE_SUM, SOLVE_COUNT),
    *(PREFIX_PROMPT, PREFIX_HIT),
    *WAITS.values(),
)


class DashboardSource(Protocol):
    name: str

    async def read(self, readings: Sequence[Reading]) -> dict[Reading, Series]: ...

    async def history(self, now_s: float) -> list[HistoryPoint]: ...

    def events(self) -> list[PlaneEvent]:
        """Recent swaps and evictions, newest first (only a process's own recorder has them)."""
        ...


class LocalSource:
    """The process's own registry: exactly what its /metrics shows."""

    name = "local"

    def __init__(self, metrics: PlaneMetrics) -> None:
        self.metrics = metrics

    async def read(self, readings: Sequence[Reading]) -> dict[Reading, Series]:
        return read_registry(self.metrics.registry, readings)

    async def history(self, now_s: float) -> list[HistoryPoint]:
        self.metrics.history.maybe_sample(now_s, self.metrics.registry)
        return list(self.metrics.history.points)

    def events(self) -> list[PlaneEvent]:
        return list(reversed(self.metrics.events))


@dataclass(frozen=True, slots=True)
class _Cached:
    at_s: float
    view: dict[str, Any]


class Dashboard:
    """Builds views from a source for the configured classes; caches one per interval."""

    def __init__(
        self,
        source: DashboardSource,
        clock: Clock,
        slo_classes: Sequence[str],
        refresh_s: float = 1.0,
    ) -> None:
        self.source = source
        self.clock = clock
        self.slo_classes = tuple(slo_classes)
        self.refresh_s = refresh_s
        self._cached: _Cached | None = None
        self._lock = asyncio.Lock()

    async def view(self) -> dict[str, Any]:
        async with self._lock:
            now_s = self.clock.now_s()
            cached = self._cached
            if cached is not None and now_s - cached.at_s < self.refresh_s:
                return cached.view
            readings, history = await asyncio.gather(
                self.source.read(READINGS), self.source.history(now_s)
            )
            view = build_view(readings, history, self.source.events(), self.slo_classes, now_s)
            view["source"] = self.source.name
            self._cached = _Cached(now_s, view)
            return view


def build_view(
    readings: Mapping[Reading, Series],
    history: Sequence[HistoryPoint],
    events: Iterable[PlaneEvent],
    slo_classes: Sequence[str],
    now_s: float,
) -> dict[str, Any]:
    """The dashboard's JSON. Ratios are null where nothing was evaluated yet."""
    one = {r: by_first(readings.get(r, {})) for r in (MET, EVALUATED, QUEUE, GROUPS, TARGET)}
    seen = {c for r in (MET, EVALUATED, QUEUE) for c in one[r]}
    classes = [*slo_classes, *sorted(seen - set(slo_classes))]
    return {
        "generated_at_s": now_s,
        "classes": classes,
        "attainment": {c: _attainment(one, c) for c in classes},
        "attainment_by_model": _by_model(readings),
        "queue": {c: one[QUEUE].get(c, 0.0) for c in classes},
        "groups": {c: one[GROUPS].get(c, 0.0) for c in classes},
        "requests": _outcomes(readings.get(OUTCOMES, {})),
        "misses_by_cause": _misses(readings.get(MISSED, {}), classes),
        "instances": _instances(readings),
        "prefix": _prefix(readings),
        "waits": {c: _waits(readings, c) for c in classes},
        "planner": _planner(readings),
        "events": [
            {"at_s": e.at_s, "kind": e.kind, "instance_id": e.instance_id, "detail": e.detail}
            for e in events
        ],
        "history": [p.to_json() for p in history],
    }


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _attainment(one: Mapping[Reading, dict[str, float]], slo_class: str) -> dict[str, Any]:
    met = one[MET].get(slo_class, 0.0)
    evaluated = one[EVALUATED].get(slo_class, 0.0)
    return {
        "met": met,
        "evaluated": evaluated,
        "ratio": _ratio(met, evaluated),
        "target": one[TARGET].get(slo_class),
    }


def _by_model(readings: Mapping[Reading, Series]) -> list[dict[str, Any]]:
    met = readings.get(MET_BY_MODEL, {})
    evaluated = readings.get(EVALUATED_BY_MODEL, {})
    rows = []
    for key in sorted(evaluated):
        m, e = met.get(key, 0.0), evaluated[key]
        rows.append(
            {"slo_class": key[0], "model_name": key[1], "met": m, "evaluated": e,
             "ratio": _ratio(m, e)}
        )  # fmt: skip
    return rows


def _outcomes(series: Series) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for (slo_class, outcome), value in series.items():
        out.setdefault(slo_class, {})[outcome] = value
    return out


def _misses(series: Series, classes: Sequence[str]) -> dict[str, dict[str, float]]:
    """Missed requests per class and cause; causes with none left out."""
    out: dict[str, dict[str, float]] = {c: {} for c in classes}
    for (slo_class, cause), value in sorted(series.items()):
        if value > 0:
            out.setdefault(slo_class, {})[cause] = value
    return out


def _instances(readings: Mapping[Reading, Series]) -> list[dict[str, Any]]:
    """One row per instance: the state whose gauge is 1 and the model on that series."""
    current: dict[str, tuple[str, str]] = {}
    for (iid, state, model), value in readings.get(STATE, {}).items():
        if value >= 1:
            current[iid] = (state, model)
    kinds = (RUNNING, KV, BUSY, SWAPS, EVICTIONS, PREFIX_PROMPT, PREFIX_HIT)
    metrics = {r: by_first(readings.get(r, {})) for r in kinds}
    ids = sorted(set(current) | set(metrics[RUNNING]) | set(metrics[SWAPS]))
    return [
        {
            "instance_id": iid,
            "state": current.get(iid, ("unknown", ""))[0],
            "model_name": current.get(iid, ("", "none"))[1],
            "running": metrics[RUNNING].get(iid, 0.0),
            "kv_utilization": metrics[KV].get(iid, 0.0),
            "busy_s": metrics[BUSY].get(iid, 0.0),
            "swaps": metrics[SWAPS].get(iid, 0.0),
            "evictions": metrics[EVICTIONS].get(iid, 0.0),
            "prefix_reuse": _ratio(
                metrics[PREFIX_HIT].get(iid, 0.0), metrics[PREFIX_PROMPT].get(iid, 0.0)
            ),
        }
        for iid in ids
    ]


def _prefix(readings: Mapping[Reading, Series]) -> dict[str, Any]:
    """Prompt tokens the engines admitted and found in their prefix caches, fleet-wide
    (engines that report their cache only); reuse null before any."""
    prompt = sum(readings.get(PREFIX_PROMPT, {}).values())
    hit = sum(readings.get(PREFIX_HIT, {}).values())
    return {"prompt_tokens": prompt, "hit_tokens": hit, "reuse": _ratio(hit, prompt)}


def _waits(readings: Mapping[Reading, Series], slo_class: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in WAIT_HISTOGRAMS:
        total = by_first(readings.get(WAITS[key, "sum"], {})).get(slo_class, 0.0)
        count = by_first(readings.get(WAITS[key, "count"], {})).get(slo_class, 0.0)
        out[f"{key}_mean_s"] = _ratio(total, count)
        out[f"{key}_n"] = count
    return out


def _planner(readings: Mapping[Reading, Series]) -> dict[str, Any]:
    total = readings.get(SOLVE_SUM, {}).get((), 0.0)
    count = readings.get(SOLVE_COUNT, {}).get((), 0.0)
    return {"runs": by_first(readings.get(RUNS, {})), "solve_mean_s": _ratio(total, count)}
