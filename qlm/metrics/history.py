"""The dashboard's charts over time when it reads the process's own registry: a ring of
cumulative samples (met and evaluated requests, queue depth, by class), taken at most once per
`sample_every_s`, by the control loop's rounds and by dashboard polls. With Prometheus as the
source the same points come from a range query instead (qlm/metrics/prometheus.py)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from qlm.metrics.readings import Reading, by_first, read_registry

MET = Reading("qlm_slo_met_total", ("slo_class",))
EVALUATED = Reading("qlm_slo_evaluated_total", ("slo_class",))
QUEUE = Reading("qlm_queue_depth", ("slo_class",))
HISTORY_READINGS = {"met": MET, "evaluated": EVALUATED, "queue": QUEUE}


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    at_s: float
    values: dict[str, dict[str, float]]  # "met" | "evaluated" | "queue" -> class -> value

    def to_json(self) -> dict[str, Any]:
        return {"t": self.at_s, **self.values}


class History:
    def __init__(self, history_s: float, sample_every_s: float) -> None:
        self.sample_every_s = sample_every_s
        self.points: deque[HistoryPoint] = deque(maxlen=max(2, int(history_s / sample_every_s)))

    def maybe_sample(self, now_s: float, registry: CollectorRegistry) -> bool:
        """Append a point unless the last one is younger than sample_every_s."""
        if self.points and now_s - self.points[-1].at_s < self.sample_every_s:
            return False
        read = read_registry(registry, HISTORY_READINGS.values())
        values = {key: by_first(read[reading]) for key, reading in HISTORY_READINGS.items()}
        self.points.append(HistoryPoint(now_s, values))
        return True
