"""Aggregated series read either from a process's own registry or from Prometheus, with the same
meaning: `Reading("qlm_slo_met_total", ("slo_class",))` is `sum by (slo_class)
(qlm_slo_met_total)` in PromQL and the same sum over the registry's samples. The dashboard is
built from readings, so it shows the same figures whichever source it reads."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry
from prometheus_client.samples import Sample

Series = dict[tuple[str, ...], float]  # label values, in the reading's `by` order -> value


@dataclass(frozen=True, slots=True)
class Reading:
    name: str  # a sample name: qlm_slo_met_total, qlm_request_ttft_seconds_sum, ...
    by: tuple[str, ...]
    op: Literal["sum", "max"] = "sum"

    def promql(self) -> str:
        return f"{self.op} by ({', '.join(self.by)}) ({self.name})"


def registry_samples(registry: CollectorRegistry) -> list[Sample]:
    return [s for family in registry.collect() for s in family.samples]


def aggregate(samples: Iterable[Sample], reading: Reading) -> Series:
    """The reading over samples, as Prometheus would aggregate them."""
    out: Series = {}
    for sample in samples:
        if sample.name != reading.name:
            continue
        key = tuple(sample.labels.get(label, "") for label in reading.by)
        value = float(sample.value)
        if reading.op == "sum":
            out[key] = out.get(key, 0.0) + value
        else:
            out[key] = max(out.get(key, -math.inf), value)
    return out


def read_registry(
    registry: CollectorRegistry, readings: Iterable[Reading]
) -> dict[Reading, Series]:
    samples = registry_samples(registry)
    return {r: aggregate(samples, r) for r in readings}


def by_first(series: Mapping[tuple[str, ...], float]) -> dict[str, float]:
    """A one-label series as label value -> value."""
    return {key[0]: value for key, value in series.items()}
