"""The planner's inputs: heterogeneous fleets (A10, A100, two-GPU A100, H100), synthetic profiles
of three models, and request groups of mixed SLO classes and deadlines, seeded per case."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qlm.grouping.group import RequestGroup
from qlm.perf.profile import Profile
from qlm.solver import PlanInput
from qlm.types import DEFAULT_GPU_TYPES, DEFAULT_SLO_CLASSES, Fleet, Instance

BATCH_SIZES = (1, 16, 64, 128)
GB = 10**9
NOW_S = 10_000.0
SLO_SHARES = (0.4, 0.3, 0.3)  # interactive, batch-1, batch-2


@dataclass(frozen=True)
class Case:
    groups: int
    instances: int
    time_limit_s: float

    @property
    def label(self) -> str:
        return f"{self.groups} x {self.instances}"


CASES = (Case(20, 4, 0.8), Case(50, 8, 0.8), Case(100, 16, 0.8), Case(200, 32, 2.0))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    weight_gb: float
    kv_kib_per_token: float
    gpu_count: int
    share: float


MODELS = (
    ModelSpec("mistral-7b", 14.5, 128.0, 1, 0.55),
    ModelSpec("vicuna-13b", 26.0, 800.0, 1, 0.30),
    ModelSpec("llama-70b", 138.0, 320.0, 2, 0.15),
)

# (model, GPU type) -> (decode step s at BATCH_SIZES, prefill tokens/s, load s)
PERF: dict[tuple[str, str], tuple[tuple[float, ...], float, float]] = {
    ("mistral-7b", "A10"): ((0.025, 0.028, 0.040, 0.058), 5_000.0, 30.0),
    ("mistral-7b", "A100"): ((0.015, 0.017, 0.022, 0.030), 15_000.0, 20.0),
    ("mistral-7b", "H100"): ((0.015, 0.016, 0.018, 0.024), 20_000.0, 15.0),
    ("vicuna-13b", "A100"): ((0.022, 0.025, 0.034, 0.048), 9_000.0, 40.0),
    ("vicuna-13b", "H100"): ((0.017, 0.019, 0.025, 0.034), 14_000.0, 30.0),
    ("llama-70b", "A100"): ((0.045, 0.049, 0.052, 0.060), 6_000.0, 100.0),
}


def make_profiles() -> list[Profile]:
    specs = {m.name: m for m in MODELS}
    return [
        Profile(
            model=model,
            gpu_type=gpu,
            gpu_count=specs[model].gpu_count,
            weight_bytes=int(specs[model].weight_gb * GB),
            kv_bytes_per_token=int(specs[model].kv_kib_per_token * 1024),
            decode_batch_sizes=BATCH_SIZES,
            decode_step_s=steps,
            prefill_tokens_per_s=prefill,
            output_tokens_mean=211.0,
            output_tokens_std=200.0,
            load_s=load_s,
            max_batch_size=128,
            provenance="benchmarks/solver/ (synthetic; figures: qlm/engine/profiling/README.md)",
        )
        for (model, gpu), (steps, prefill, load_s) in PERF.items()
    ]


def make_instances(n: int, rng: np.random.Generator) -> list[Instance]:
    """n // 2 A10; max(1, n // 8) A100 x2 (llama-70b); n // 8 H100; the rest A100."""
    big = max(1, n // 8)
    h100 = n // 8
    kinds = ["A10"] * (n // 2) + ["A100x2"] * big + ["H100"] * h100
    kinds += ["A100"] * (n - len(kinds))
    return [_instance(f"{kind.lower()}-{i}", kind, rng) for i, kind in enumerate(kinds)]


def _instance(instance_id: str, kind: str, rng: np.random.Generator) -> Instance:
    gpu, count = ("A100", 2) if kind == "A100x2" else (kind, 1)
    if kind == "A100x2":
        loaded: str | None = "llama-70b"
    elif kind == "A10":
        loaded = "mistral-7b" if rng.random() < 0.8 else None
    else:
        loaded = str(rng.choice(["mistral-7b", "vicuna-13b"]))
    return Instance(instance_id, gpu, count, DEFAULT_GPU_TYPES[gpu].memory_bytes, loaded)


def make_groups(n: int, rng: np.random.Generator) -> list[RequestGroup]:
    models = rng.choice(len(MODELS), size=n, p=[m.share for m in MODELS])
    classes = rng.choice(len(DEFAULT_SLO_CLASSES), size=n, p=SLO_SHARES)
    return [
        _group(f"g{i}", MODELS[int(m)].name, int(c), rng)
        for i, (m, c) in enumerate(zip(models, classes, strict=True))
    ]


def _group(group_id: str, model: str, slo_index: int, rng: np.random.Generator) -> RequestGroup:
    slo = DEFAULT_SLO_CLASSES[slo_index]
    size = int(rng.integers(10, 251))
    slack_s = float(rng.uniform(-0.1, 1.0)) * slo.ttft_s  # negative: already late
    deadline_s = NOW_S + slack_s
    return RequestGroup(
        id=group_id,
        model=model,
        slo_class=slo.name,
        request_ids=tuple(f"{group_id}.{k}" for k in range(size)),
        prompt_tokens_mean=float(np.clip(rng.lognormal(np.log(1000), 0.6), 100, 6000)),
        output_cap_mean=float(rng.uniform(128, 1024)),
        ttft_deadline_at_s=deadline_s,
        completion_deadline_at_s=None,
        first_arrival_at_s=deadline_s - slo.ttft_s,
    )


def make_input(case: Case, seed: int) -> PlanInput:
    rng = np.random.default_rng([case.groups, case.instances, seed])
    instances = make_instances(case.instances, rng)
    fleet = Fleet.of(instances, make_profiles())
    busy = {inst.id: float(rng.uniform(0.0, 15.0)) for inst in instances}
    return PlanInput(tuple(make_groups(case.groups, rng)), fleet, NOW_S, busy_s=busy)
