"""Random planning cases shared by the planner tests."""

from __future__ import annotations

import random

from qlm.config import EstimatorConfig
from qlm.estimator import RwtEstimator
from qlm.solver import PlanInput
from qlm.types import Fleet
from tests.factories import make_group, make_instance, make_profile

CLASSES = ("interactive", "batch-1", "batch-2")


def mixed_fleet(num_instances: int) -> Fleet:
    """Half A10 (24 GiB), half A100 (80 GiB); model 'a' fits both, 'b' (26 GiB) only A100."""
    profiles = [
        make_profile("a", "A100", load_s=10.0),
        make_profile("a", "A10", step_s=(0.04, 0.05, 0.08), load_s=15.0),
        make_profile("b", "A100", weight_gib=26.0, kv_kib_per_token=800.0, load_s=20.0),
        make_profile("b", "A10", weight_gib=26.0, kv_kib_per_token=800.0, load_s=20.0),
    ]
    instances = [
        make_instance(
            f"i{q}",
            "A100" if q % 2 else "A10",
            memory_gib=80.0 if q % 2 else 24.0,
            loaded_model="b" if q % 4 == 3 else "a",
        )
        for q in range(num_instances)
    ]
    return Fleet.of(instances, profiles)


def random_input(
    seed: int, num_groups: int, num_instances: int, horizon_s: float = 300.0
) -> PlanInput:
    rng = random.Random(seed)
    groups = tuple(
        make_group(
            f"g{i}",
            size=rng.randint(5, 80),
            model=rng.choice("ab"),
            slo_class=rng.choice(CLASSES),
            deadline_at_s=rng.uniform(5.0, horizon_s),
            first_arrival_at_s=rng.uniform(-30.0, 0.0),
            completion_deadline_at_s=rng.choice([None, rng.uniform(50.0, 2 * horizon_s)]),
        )
        for i in range(num_groups)
    )
    return PlanInput(groups, mixed_fleet(num_instances), now_s=0.0)


def estimator_for(inp: PlanInput) -> RwtEstimator:
    return RwtEstimator(EstimatorConfig(), inp.fleet)


def one_swap_case() -> PlanInput:
    """One instance with model a loaded and three batch-2 groups due a, b, a: EDF orders them by
    deadline and swaps twice; serving both a groups first swaps once and meets every deadline."""
    fleet = Fleet.of(
        [make_instance("i0", loaded_model="a")],
        [make_profile("a", load_s=60.0), make_profile("b", load_s=60.0)],
    )
    groups = (
        make_group("a1", model="a", deadline_at_s=100.0, slo_class="batch-2"),
        make_group("b1", model="b", deadline_at_s=200.0, slo_class="batch-2"),
        make_group("a2", model="a", deadline_at_s=300.0, slo_class="batch-2"),
    )
    return PlanInput(groups, fleet, now_s=0.0)
