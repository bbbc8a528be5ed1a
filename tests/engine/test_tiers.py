"""The standby tier (qlm/engine/model/tiers.py) and what it changes: a model that sleeps on an
instance wakes in the profile's wake_s instead of loading in load_s, in the engine model and
in the estimator the planner prices swaps with."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qlm.config import EstimatorConfig
from qlm.config.engine_config import EngineConfig
from qlm.engine.engine_types import ModelLoaded
from qlm.engine.model.tiers import StandbyTier
from qlm.estimator import RwtEstimator
from qlm.types import Fleet
from tests.engine.helpers import engine, exact_profile
from tests.factories import make_group, make_instance, make_profile


def test_the_tier_keeps_the_most_recently_served_models() -> None:
    tier = StandbyTier(2, ["a", "a", "b", "c"])
    assert tier.models == ("a", "b")  # duplicates once, trimmed to capacity
    tier.sleep("c")
    assert tier.models == ("c", "a")  # b, served least recently, went cold
    assert tier.wake("a")
    assert tier.models == ("c",)
    assert not tier.wake("b")
    none = StandbyTier(0)
    none.sleep("a")
    assert none.models == ()
    with pytest.raises(ValueError, match="standby capacity"):
        StandbyTier(-1)


def _loads(standby_models: int) -> list[float]:
    """m -> n -> m -> p -> m on one engine; each load's time (ModelLoaded.load_s)."""
    profiles = [
        replace(exact_profile(name, load_s=20.0), wake_s=wake)
        for name, wake in (("m", 1.0), ("n", 2.0), ("p", None))
    ]
    model = engine(profiles=profiles, config=EngineConfig(standby_models=standby_models))
    t, loads = 0.0, []
    for name in ("n", "m", "p", "m"):
        model.load(name, t)
        t += 100.0
        loads += [e.load_s for e in model.advance_to(t) if isinstance(e, ModelLoaded)]
    return loads


def test_a_sleeping_model_wakes_in_wake_s_and_others_load_cold() -> None:
    # n cold; m was left asleep by the first load: wake; p has no standby tier: cold;
    # m sleeps again (one slot: p's load put m to sleep after n went cold)
    assert _loads(standby_models=1) == [20.0, 1.0, 20.0, 1.0]
    assert _loads(standby_models=0) == [20.0, 20.0, 20.0, 20.0]


def test_a_second_load_of_the_same_model_changes_nothing() -> None:
    """Two LoadModel actions for one model in one instant (the simulator applies a round's
    actions together) restarted the load cold and put the loading model to sleep: every
    later swap back was cold (49 of 139 loads on the density scenario)."""
    profiles = [replace(exact_profile(name, load_s=20.0), wake_s=1.0) for name in ("m", "n")]
    model = engine(profiles=profiles, config=EngineConfig(standby_models=2))
    model.load("n", 0.0)
    model.load("n", 0.0)  # loading it: nothing to do
    assert model.observe(0.0).standby_models == ("m",)
    loaded = [e.load_s for e in model.advance_to(50.0) if isinstance(e, ModelLoaded)]
    model.load("n", 50.0)  # serving it: nothing to do
    model.load("m", 60.0)
    loaded += [e.load_s for e in model.advance_to(100.0) if isinstance(e, ModelLoaded)]
    assert loaded == [20.0, 1.0]  # m woke: it slept since n's load


def test_the_observation_lists_the_sleeping_models() -> None:
    profiles = [exact_profile(name) for name in ("m", "n", "p")]
    model = engine(profiles=profiles, config=EngineConfig(standby_models=2))
    model.load("n", 0.0)
    model.load("p", 100.0)
    assert model.observe(200.0).standby_models == ("n", "m")


def test_the_estimator_prices_a_swap_to_a_sleeping_model_at_its_wake_time() -> None:
    profile = replace(make_profile("m13b", load_s=30.0), wake_s=2.0)
    asleep = replace(make_instance("i0"), standby_models=("m13b",))
    awake = make_instance("i1")
    fleet = Fleet.of([asleep, awake], [make_profile("m7b"), profile])
    estimator = RwtEstimator(EstimatorConfig(), fleet)
    group = make_group(model="m13b")
    costs = [estimator.group_cost(group, i) for i in (asleep, awake)]
    assert [c.load_s if c else None for c in costs] == [2.0, 30.0]


def test_the_estimator_walks_the_tier_a_model_left_on_the_instance_wakes() -> None:
    """m7b serves, m13b sleeps: to m13b is a wake, back to m7b a wake too (m7b slept when
    the instance left it), whereas without a tier both swaps load cold."""
    profiles = [replace(make_profile(m, load_s=30.0), wake_s=2.0) for m in ("m7b", "m13b")]
    tiered = replace(make_instance("i0"), standby_models=("m13b",), standby_capacity=1)
    cold = make_instance("i1")
    estimator = RwtEstimator(EstimatorConfig(), Fleet.of([tiered, cold], profiles))
    queue = [make_group(f"g{k}", size=1, model=m) for k, m in enumerate(("m13b", "m7b"))]
    warm_walk, cold_walk = (estimator.estimate_queue(queue, i).groups for i in (tiered, cold))
    assert [g.swap_before for g in warm_walk] == [True, True]
    gaps = [c.start_s - w.start_s for w, c in zip(warm_walk, cold_walk, strict=True)]
    assert gaps == pytest.approx([28.0, 56.0])  # each cold load 28 s longer than a wake
