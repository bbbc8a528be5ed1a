"""The autoscaler's need per pool (qlm/autoscale/need.py) and its demand window."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from qlm.autoscale.demand import DemandWindow, ModelDemand
from qlm.autoscale.need import Pool, backlog_units, pool_needs, pools_of, request_work_s
from qlm.config import AutoscaleConfig, AutoscalePoolConfig, EstimatorConfig
from qlm.estimator.rwt import RwtEstimator
from qlm.types import Fleet
from tests.factories import group_of, make_instance, make_profile, make_request

CONFIG = AutoscaleConfig(target_utilization=1.0)


def fleet_and_pools(
    cheap_max: int = 4, dear_max: int = 4, load_s: float = 10.0
) -> tuple[Fleet, list[Pool]]:
    cheap = tuple(make_instance(f"a-{k}", "A100") for k in range(cheap_max))
    dear = tuple(make_instance(f"h-{k}", "H100") for k in range(dear_max))
    profiles = [
        make_profile("m7b", "A100", load_s=load_s),
        make_profile("m7b", "H100", load_s=load_s, step_s=(0.01, 0.0125, 0.02)),
        make_profile("m13b", "H100", load_s=load_s, weight_gib=26.0),
    ]
    fleet = Fleet.of((*cheap, *dear), profiles)
    return fleet, [Pool("a", cheap, 0, 2.0), Pool("h", dear, 0, 8.0)]


def demand(model: str = "m7b", rate: float = 1.0, budget_s: float = 600.0) -> ModelDemand:
    return ModelDemand(model, rate, 500.0, 512.0, budget_s)


def test_work_per_request_is_the_estimators_occupancy() -> None:
    fleet, pools = fleet_and_pools()
    instance = pools[0].instances[0]
    profile = fleet.profile("m7b", instance)
    assert profile is not None
    cost = RwtEstimator(EstimatorConfig(), fleet).group_cost(
        group_of([make_request(prompt_tokens=500, max_output_tokens=512)]), instance
    )
    assert cost is not None
    assert request_work_s(profile, instance, 500, 512) == pytest.approx(cost.occupancy_s)


def test_need_is_rate_times_work_at_the_target_utilization() -> None:
    fleet, pools = fleet_and_pools()
    profile = fleet.profile("m7b", pools[0].instances[0])
    assert profile is not None
    work = request_work_s(profile, pools[0].instances[0], 500, 512)
    rate = 2.5 / work  # 2.5 instances at full use
    needs = pool_needs(pools, fleet, [demand(rate=rate)], [], 0.0, CONFIG)
    assert needs["a"].units == pytest.approx(2.5)
    assert needs["a"].replicas == 3
    assert needs["h"].replicas == 0
    half = pool_needs(pools, fleet, [demand(rate=rate)], [], 0.0, AutoscaleConfig())
    assert half["a"].units == pytest.approx(2.5 / 0.8)


def test_overflow_goes_to_the_next_pool_and_the_rest_is_unmet() -> None:
    fleet, pools = fleet_and_pools(cheap_max=2, dear_max=2)
    profile = fleet.profile("m7b", pools[0].instances[0])
    assert profile is not None
    work = request_work_s(profile, pools[0].instances[0], 500, 512)
    needs = pool_needs(pools, fleet, [demand(rate=10 / work)], [], 0.0, CONFIG)
    assert needs["a"].replicas == 2
    assert needs["h"].replicas == 2
    assert needs["a"].unmet_units > 0


def test_urgent_models_stay_resident_and_the_rest_share() -> None:
    fleet, pools = fleet_and_pools(load_s=30.0)
    tiny = 0.01
    shared = pool_needs(pools, fleet, [demand("m7b", tiny), demand("m13b", tiny)], [], 0.0, CONFIG)
    # a trickle of two batch models: one H100 instance for m13b, swaps do the rest
    assert shared["h"].shared == ("m13b",)
    assert shared["h"].replicas == 1
    urgent = pool_needs(
        pools,
        fleet,
        [demand("m7b", tiny, budget_s=5.0), demand("m13b", tiny, budget_s=5.0)],
        [],
        0.0,
        CONFIG,
    )
    assert urgent["a"].resident == ("m7b",)
    assert urgent["h"].resident == ("m13b",)
    assert urgent["a"].replicas == 1
    assert urgent["h"].replicas == 1


def test_backlog_counts_by_deadline() -> None:
    fleet, pools = fleet_and_pools()
    instance = pools[0].instances[0]
    profile = fleet.profile("m7b", instance)
    assert profile is not None
    work = request_work_s(profile, instance, 500, 512)
    soon = [make_request(ttft_s=60.0) for _ in range(100)]
    late = [make_request(ttft_s=3600.0) for _ in range(100)]
    assert backlog_units(soon, profile, instance, 0.0) == pytest.approx(100 * work / 60.0)
    assert backlog_units(late, profile, instance, 0.0) == pytest.approx(100 * work / 3600.0)
    # past deadlines count as due after a load: no division by ~0
    overdue = [make_request(ttft_s=1.0, arrival_at_s=-100.0) for _ in range(10)]
    assert backlog_units(overdue, profile, instance, 0.0) == pytest.approx(10 * work / 10.0)
    needs = pool_needs(pools, fleet, [], soon, 0.0, CONFIG)
    assert needs["a"].units == pytest.approx(100 * work / 60.0)


def test_random_demands_need_more_when_they_grow() -> None:
    rng = random.Random(7)
    fleet, pools = fleet_and_pools(cheap_max=50, dear_max=50)
    for _ in range(200):
        demands = [
            demand(m, rng.uniform(0.0, 5.0), rng.choice((2.0, 600.0))) for m in ("m7b", "m13b")
        ]
        queued = [
            make_request(model=rng.choice(("m7b", "m13b")), ttft_s=rng.uniform(1, 900))
            for _ in range(rng.randrange(20))
        ]
        base = pool_needs(pools, fleet, demands, queued, 0.0, CONFIG)
        more = [
            ModelDemand(d.model, d.rate_per_s * 1.5, 500.0, 512.0, d.ttft_budget_min_s)
            for d in demands
        ]
        grown = pool_needs(pools, fleet, more, [*queued, make_request(ttft_s=30.0)], 0.0, CONFIG)
        total = sum(n.units for n in base.values())
        assert sum(n.units for n in grown.values()) >= total - 1e-9
        assert sum(n.replicas for n in grown.values()) >= sum(n.replicas for n in base.values())
        for need in base.values():  # whole instances cover the fractional need
            assert need.replicas >= need.units - 1e-9 or need.replicas == 50


def test_pools_of_checks_the_fleet() -> None:
    fleet, _ = fleet_and_pools()
    config = AutoscaleConfig(
        pools=(AutoscalePoolConfig(name="a", instance_prefix="a", max_replicas=4),)
    )
    (pool,) = pools_of(config, fleet, {"A100": 1.5})
    assert [i.id for i in pool.instances] == ["a-0", "a-1", "a-2", "a-3"]
    assert pool.cost_per_hour == 1.5
    too_many = AutoscaleConfig(
        pools=(AutoscalePoolConfig(name="a", instance_prefix="a", max_replicas=5),)
    )
    with pytest.raises(ValueError, match="no instance a-4"):
        pools_of(too_many, fleet, {})


def test_demand_window_rates_dedups_and_forgets() -> None:
    window = DemandWindow(window_s=10.0)
    requests = [make_request(arrival_at_s=t, ttft_s=5.0 + t) for t in range(10)]
    for r in [*requests, *requests]:  # seen twice: the live loop sees a queued one each round
        window.arrived(r)
    (d,) = window.demand(9.0)
    assert d.rate_per_s == pytest.approx(1.0)
    assert d.ttft_budget_min_s == 5.0
    (later,) = window.demand(14.5)  # arrivals before 4.5 s left the window
    assert later.rate_per_s == pytest.approx(0.5)
    assert window.demand(100.0) == ()
    window.arrived(requests[0])  # forgotten, so it counts again
    assert window.demand(10.0)[0].rate_per_s == pytest.approx(0.1)


def test_a_standby_tier_lets_urgent_models_share() -> None:
    fleet, pools = fleet_and_pools(load_s=30.0)
    woken = Fleet.of(fleet.instances, [replace(p, wake_s=1.0) for p in fleet.profiles.values()])
    urgent = [demand("m7b", 0.01, budget_s=5.0)]
    cold = pool_needs(pools, woken, urgent, [], 0.0, CONFIG)
    assert cold["a"].resident == ("m7b",)  # pools without the tier load cold (30 s)
    standby = [replace(p, standby_slots=1) for p in pools]
    warm = pool_needs(standby, woken, urgent, [], 0.0, CONFIG)
    assert warm["a"].resident == ()
    assert warm["a"].shared == ("m7b",)  # it wakes in 1 s, within its 5 s budget
    assert warm["a"].warm == ("m7b",)


def test_warm_models_need_room_to_sleep() -> None:
    """Five urgent models that can wait for a wake but not for a cold load, a trickle each:
    with 1 sleep slot per instance they need 3 instances (2 models each at most)."""
    models = [f"m{k}" for k in range(5)]
    instances = tuple(make_instance(f"a-{k}", "A100") for k in range(8))
    profiles = [replace(make_profile(m, "A100", load_s=30.0), wake_s=1.0) for m in models]
    fleet = Fleet.of(instances, profiles)
    trickle = [demand(m, 0.001, budget_s=5.0) for m in models]
    for slots, replicas in ((1, 3), (2, 2), (4, 1)):
        pool = Pool("a", instances, 0, 1.0, standby_slots=slots)
        need = pool_needs([pool], fleet, trickle, [], 0.0, CONFIG)["a"]
        assert len(need.warm) == 5
        assert need.replicas == replicas, (slots, need)
