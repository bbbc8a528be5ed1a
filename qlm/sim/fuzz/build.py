"""Random scenarios from a seed: `draw_scenario(seed, size)` draws a plan (choices.py), estimates
the fleet's capacity for its request mix (throughput.py), draws a load of 0.5-1.5 x that capacity
and sets every stream's rate so that the expected requests match, then writes the scenario's
document (what a scenario file holds); qlm.sim.scenario.random_scenario validates it into a
Scenario (this package does not import qlm.sim.scenario, so that load_scenario can use it).

A draw whose requests cannot fit the size's bounds (too many even over the shortest window, or
too few over the longest) is drawn again from the next attempt's generator, so the scenario is
still a function of the seed alone.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qlm.sim.fuzz.choices import (
    InstancePlan,
    LengthMix,
    StreamPlan,
    can_run,
    draw_fleet,
    draw_models,
    draw_streams,
    fitting_profiles,
    model_shares,
)
from qlm.sim.fuzz.throughput import LengthMoments, fleet_capacity_per_s, request_cost_s
from qlm.sim.traces import load_trace
from qlm.sim.workload import RateProfile
from qlm.types import DEFAULT_GPU_TYPES, DEFAULT_SLO_CLASSES

DATA_DIR = Path(__file__).resolve().parents[3] / "sims" / "data"
MAX_ATTEMPTS = 200


@dataclass(frozen=True)
class FuzzSize:
    """Bounds of a random scenario: fleet, models, arrival window, requests and load."""

    min_instances: int = 2
    max_instances: int = 8
    max_models: int = 5
    min_window_s: float = 60.0
    max_window_s: float = 200.0
    min_requests: int = 100
    max_requests: int = 3000
    min_load: float = 0.5
    max_load: float = 1.5


SIZES: Mapping[str, FuzzSize] = {
    "quick": FuzzSize(),
    "tiny": FuzzSize(max_instances=4, min_window_s=30, max_window_s=60, min_requests=40,
                     max_requests=300),
}  # fmt: skip


@dataclass(frozen=True)
class FuzzDraw:
    """A random scenario and the figures it was sized by."""

    seed: int
    document: Mapping[str, Any]  # the scenario, as a scenario file would hold it
    load_factor: float  # expected requests / (capacity_per_s x window_s)
    capacity_per_s: float  # fleet_capacity_per_s for the request mix
    window_s: float
    expected_requests: float
    model_shares: Mapping[str, float]
    class_shares: Mapping[str, float]
    attempts: int

    def summary(self, streams: bool = True) -> str:
        """One line: fleet, models, load, classes and (unless streams is False) streams."""
        fleet = " + ".join(
            f"{g['count']}x{_gpus(fitting_profiles()[(g['model'], g['gpu_type'])].gpu_count)}"
            f"{g['gpu_type']}:{g['model']}"
            for g in self.document["fleet"]["instances"]
        )
        models = ", ".join(f"{m} {v:.0%}" for m, v in self.model_shares.items())
        classes = ", ".join(f"{c} {v:.0%}" for c, v in self.class_shares.items())
        line = (
            f"{fleet}; {models}; load {self.load_factor:.2f} of {self.capacity_per_s:.1f} req/s; "
            f"{classes}"
        )
        return f"{line}; {self.document['description']}" if streams else line


def _gpus(count: int) -> str:
    return "" if count == 1 else f"{count}"


def draw_scenario(seed: int, size: str | FuzzSize = "quick", data_dir: Path = DATA_DIR) -> FuzzDraw:
    """The random scenario of this seed with its sizing figures."""
    bounds = SIZES[size] if isinstance(size, str) else size
    for attempt in range(MAX_ATTEMPTS):
        rng = np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(attempt,)))
        found = _attempt(seed, rng, bounds, data_dir)
        if found is not None:
            return FuzzDraw(**{**found, "attempts": attempt + 1})
    raise RuntimeError(f"seed {seed}: no scenario within {bounds} in {MAX_ATTEMPTS} draws")


def _attempt(
    seed: int, rng: np.random.Generator, size: FuzzSize, data_dir: Path
) -> dict[str, Any] | None:
    """One draw; None when its requests cannot fit the size's bounds."""
    models = draw_models(rng, size.max_models)
    streams = draw_streams(rng, models)
    shares = model_shares(streams)
    count = int(rng.integers(max(size.min_instances, len(models)), size.max_instances + 1))
    fleet = draw_fleet(rng, models, shares, count)
    capacity = fleet_capacity_per_s(instance_rates(fleet, streams, data_dir), shares)
    load = float(rng.uniform(size.min_load, size.max_load))
    window = float(rng.uniform(size.min_window_s, size.max_window_s))
    rate = load * capacity
    window = min(max(window, size.min_requests / rate), size.max_requests / rate)
    window = math.floor(window * 10.0) / 10.0  # never above max_requests
    if not size.min_window_s <= window <= size.max_window_s:
        return None
    requests = rate * window
    document = _document(seed, fleet, streams, requests, window, data_dir)
    return {
        "seed": seed,
        "document": document,
        "load_factor": load,
        "capacity_per_s": capacity,
        "window_s": window,
        "expected_requests": requests,
        "model_shares": shares,
        "class_shares": _class_shares(streams),
    }


@functools.cache
def _moments(lengths: LengthMix, data_dir: Path) -> LengthMoments:
    trace = load_trace(data_dir / lengths.file, lengths.format)
    rows = trace.where_prompt(lengths.min_prompt_tokens, lengths.max_prompt_tokens)
    return LengthMoments.of(rows, lengths.max_output_tokens)


def instance_rates(
    fleet: Sequence[InstancePlan], streams: Sequence[StreamPlan], data_dir: Path
) -> list[dict[str, float]]:
    """For each instance, the requests per second it serves of each model it can run, with
    that model's mix of lengths (each stream's share of the model's requests)."""
    weights: dict[str, list[tuple[float, LengthMix]]] = {}
    for s in streams:
        total = sum(s.models.values())
        for m, w in s.models.items():
            weights.setdefault(m, []).append((s.share * w / total, s.lengths))
    rates = []
    for inst in fleet:
        memory = DEFAULT_GPU_TYPES[inst.gpu_type].memory_bytes
        served = {}
        for model, mix in weights.items():
            profile = can_run(inst, model)
            if profile is None:
                continue
            norm = sum(w for w, _ in mix)
            cost_s = sum(
                w / norm * request_cost_s(profile, memory, _moments(lengths, data_dir))
                for w, lengths in mix
            )
            served[model] = 1.0 / cost_s
        rates.append(served)
    return rates


def _class_shares(streams: Sequence[StreamPlan]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in streams:
        total = sum(s.classes.values())
        for c, w in s.classes.items():
            out[c] = out.get(c, 0.0) + s.share * w / total
    order = [c.name for c in DEFAULT_SLO_CLASSES]
    return {c: out[c] for c in sorted(out, key=order.index)}


def _document(
    seed: int,
    fleet: Sequence[InstancePlan],
    streams: Sequence[StreamPlan],
    requests: float,
    window_s: float,
    data_dir: Path,
) -> dict[str, Any]:
    groups: dict[tuple[str, str], int] = {}
    for inst in fleet:
        groups[(inst.gpu_type, inst.model)] = groups.get((inst.gpu_type, inst.model), 0) + 1
    data = {
        "name": f"random-{seed}",
        "description": "; ".join(_stream_words(s) for s in streams),
        "seed": seed,
        "fleet": {
            "instances": [{"gpu_type": g, "count": n, "model": m} for (g, m), n in groups.items()]
        },
        "workload": [stream_document(s, requests, window_s, data_dir) for s in streams],
    }
    return data


def stream_document(
    s: StreamPlan, requests: float, window_s: float, data_dir: Path
) -> dict[str, Any]:
    """The stream's configuration: its expected requests are its share of `requests`."""
    start_s = round(s.shape.start_frac * window_s, 1)
    lengths: dict[str, Any] = {
        "source": "trace",
        "path": str(data_dir / s.lengths.file),
        "format": s.lengths.format,
    }
    for key in ("min_prompt_tokens", "max_prompt_tokens", "max_output_tokens"):
        if getattr(s.lengths, key) is not None:
            lengths[key] = getattr(s.lengths, key)
    out: dict[str, Any] = {
        "name": s.name,
        "start_s": start_s,
        "models": dict(s.models),
        "classes": dict(s.classes),
        "lengths": lengths,
    }
    expected = s.share * requests
    if s.backlog:
        return {**out, "arrivals": {"process": "backlog"}, "count": max(1, round(expected))}
    duration_s = round(window_s - start_s, 1)
    bursts = tuple((b * window_s, d * window_s, k) for b, d, k in s.shape.bursts)
    ramp = (
        None
        if s.shape.ramp is None
        else (s.shape.ramp[0] * window_s, s.shape.ramp[1] * window_s, s.shape.ramp[2])
    )
    spans = tuple((b, b + d, k) for b, d, k in bursts)  # RateProfile takes (start, end, factor)
    per_unit_rate = RateProfile.build(1.0, ramp, spans).cumulative(duration_s)
    rate = expected / per_unit_rate
    out["arrivals"] = {"process": "gamma", "rate_per_s": round(rate, 4), "cv": s.shape.cv}
    out["duration_s"] = duration_s
    if bursts:
        out["bursts"] = [
            {"start_s": round(b, 1), "duration_s": round(d, 1), "factor": k} for b, d, k in bursts
        ]
    if ramp is not None:
        out["ramp"] = {
            "to_rate_per_s": round(rate * ramp[2], 4),
            "start_s": round(ramp[0], 1),
            "end_s": round(ramp[1], 1),
        }
    return out


def _stream_words(s: StreamPlan) -> str:
    if s.backlog:
        return f"{s.name} {s.share:.0%} backlog {s.lengths.name}"
    words = [f"{s.name} {s.share:.0%} gamma cv {s.shape.cv:g} {s.lengths.name}"]
    words += [f"burst x{k:g}" for _, _, k in s.shape.bursts]
    if s.shape.ramp is not None:
        words.append(f"ramp x{s.shape.ramp[2]:.2g}")
    return " ".join(words)
