"""Small simulation cases shared by the runner and policy tests."""

from __future__ import annotations

from qlm.config import PlannerConfig, QlmConfig
from qlm.sim.events import RandomStreams
from qlm.types import Fleet, Request, SloClass
from tests.factories import make_instance, make_profile

# A short planner time limit keeps the MILP policies quick in tests.
CONFIG = QlmConfig(planner=PlannerConfig(time_limit_s=0.3, threads=1))
CLASSES = {c.name: c for c in CONFIG.slo_class_map().values()}


def two_model_fleet(num_7b: int = 2, num_13b: int = 1, load_s: float = 5.0) -> Fleet:
    """A100s with m7b or m13b loaded; both models fit every instance."""
    profiles = [
        make_profile("m7b", load_s=load_s, output_mean=120, output_std=80),
        make_profile(
            "m13b",
            weight_gib=26.0,
            step_s=(0.03, 0.04, 0.06),
            load_s=load_s,
            output_mean=120,
            output_std=80,
        ),
    ]
    instances = [make_instance(f"a{k}", loaded_model="m7b") for k in range(num_7b)]
    instances += [make_instance(f"b{k}", loaded_model="m13b") for k in range(num_13b)]
    return Fleet.of(instances, profiles)


def mixed_requests(
    count: int,
    rate_per_s: float,
    seed: int,
    models: tuple[str, ...] = ("m7b", "m13b"),
    classes: tuple[str, ...] = ("interactive", "batch-1", "batch-2"),
) -> list[Request]:
    """Poisson arrivals; uniform model and class mix; prompts 50-1500, outputs 5-400."""
    rng = RandomStreams(seed).generator("requests")
    times = rng.exponential(1 / rate_per_s, count).cumsum()
    requests = []
    for i, at_s in enumerate(times):
        slo: SloClass = CLASSES[classes[int(rng.integers(len(classes)))]]
        requests.append(
            Request.create(
                f"r{i}",
                models[int(rng.integers(len(models)))],
                int(rng.integers(50, 1500)),
                int(rng.integers(5, 400)),
                slo,
                float(at_s),
            )
        )
    return requests
