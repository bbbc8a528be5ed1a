"""Which requests does a workload produce, and in what order?

Each stream draws from its own random generators, one per component (arrivals, lengths,
models, classes), seeded from the scenario seed and the component's name (`component_rng`),
so adding or changing one stream or component never shifts another's draws. Streams are
generated in chunks and merged lazily (`iter_requests`), so a million requests never need more
than the request objects the caller keeps.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from qlm.prefixes.job_plan import PlanBudget, plan_job, with_plan
from qlm.sim.workload.arrivals import TraceArrivals, arrival_times
from qlm.sim.workload.lengths import IntArray, LengthSampler, ReplayLengths
from qlm.sim.workload.prefixes import Blocks, PrefixSampler
from qlm.sim.workload.rates import FloatArray
from qlm.sim.workload.stream import StreamConfig
from qlm.types import Request, SloClass


def component_rng(seed: int, component: str) -> np.random.Generator:
    """A generator for one named stochastic component: SeedSequence(seed) with a spawn key
    derived from the name (stable across runs and Python versions)."""
    digest = hashlib.blake2b(component.encode("utf-8"), digest_size=8).digest()
    key = int.from_bytes(digest, "little")
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(key,)))


@dataclass(frozen=True)
class StreamChunk:
    """Up to CHUNK consecutive requests of one stream, as columns."""

    first_index: int
    arrival_s: FloatArray  # absolute (stream start included)
    prompt_tokens: IntArray
    output_tokens: IntArray
    model_index: IntArray
    class_index: IntArray
    prefixes: list[Blocks] | None = None  # per request, when the stream has prefixes


def _categorical(rng: np.random.Generator, weights: Mapping[str, float], n: int) -> IntArray:
    if len(weights) == 1:
        return np.zeros(n, dtype=np.int64)
    p = np.asarray(list(weights.values()), dtype=np.float64)
    return rng.choice(len(p), size=n, p=p / p.sum()).astype(np.int64)


def stream_chunks(spec: StreamConfig, seed: int) -> Iterator[StreamChunk]:
    """The stream's requests, in arrival order, CHUNK at a time."""
    replayed = spec.arrivals if isinstance(spec.arrivals, TraceArrivals) else None
    lengths = LengthSampler(
        spec.lengths if spec.lengths is not None else ReplayLengths(source="replay"),
        component_rng(seed, f"{spec.name}/lengths"),
        replayed,
    )
    prefixes = None
    if spec.prefixes is not None:
        prefixes = PrefixSampler(
            spec.prefixes, spec.name, component_rng(seed, f"{spec.name}/prefixes")
        )
    models_rng = component_rng(seed, f"{spec.name}/models")
    classes_rng = component_rng(seed, f"{spec.name}/classes")
    times_s = arrival_times(
        spec.arrivals,
        spec.count,
        spec.duration_s,
        spec.rate_profile,
        component_rng(seed, f"{spec.name}/arrivals"),
    )
    index = 0
    for times in times_s:
        n = len(times)
        prompts, outputs = lengths.draw(n)
        blocks = None
        if prefixes is not None:
            prompts, blocks = prefixes.draw(prompts, lengths.rows, lengths.last_rows)
        yield StreamChunk(
            index,
            times + spec.start_s,
            prompts,
            outputs,
            _categorical(models_rng, spec.models, n),
            _categorical(classes_rng, spec.classes, n),
            blocks,
        )
        index += n


def stream_requests(
    spec: StreamConfig, seed: int, slo_classes: Mapping[str, SloClass]
) -> Iterator[Request]:
    """The stream's requests, in arrival order, ids `<stream name>-<index>`."""
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
            prefix = () if chunk.prefixes is None else chunk.prefixes[k]
            yield Request.create(
                f"{spec.name}-{chunk.first_index + k}",
                models[m],
                p,
                o,
                classes[c],
                t,
                prefix=prefix,
            )


def planned_job(
    spec: StreamConfig, requests: Iterator[Request], budget: Callable[[str], PlanBudget]
) -> Iterator[Request]:
    """A `job_plan` stream's requests carrying their place in the job's plan
    (qlm/prefixes/job_plan.py), one plan per model, ids `<stream name>:<model>`; the
    backlog's order is kept."""
    backlog = list(requests)
    placed: dict[str, Request] = {}
    for model in spec.models:
        mine = [r for r in backlog if r.model == model]
        job_id = f"{spec.name}:{model}"
        placed.update(
            (r.id, r) for r in with_plan(mine, plan_job(job_id, mine, budget(model)), job_id)
        )
    return (placed[r.id] for r in backlog)


def iter_requests(
    streams: Sequence[StreamConfig],
    seed: int,
    slo_classes: Mapping[str, SloClass],
    horizon_s: float | None = None,
    budget: Callable[[str], PlanBudget] | None = None,
) -> Iterator[Request]:
    """All streams merged in arrival order (ties: the earlier stream, then its order), each
    request's max_output_tokens its true output length; arrivals at or after horizon_s are
    dropped. `job_plan` streams are planned as jobs with `budget` (per model)."""

    def of(spec: StreamConfig) -> Iterator[Request]:
        requests = stream_requests(spec, seed, slo_classes)
        if not spec.job_plan:
            return requests
        if budget is None:
            raise ValueError(f"stream {spec.name}: job_plan needs the fleet's plan budget")
        return planned_job(spec, requests, budget)

    merged = heapq.merge(*(of(s) for s in streams), key=lambda r: r.arrival_at_s)
    for request in merged:
        if horizon_s is not None and request.arrival_at_s >= horizon_s:
            return
        yield request
