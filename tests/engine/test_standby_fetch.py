"""Filling the standby tier while serving (qlm/engine/model/tiers.py `fetch`, EngineModel
`fetch_standby`): a fetched model sleeps there once its weights are read (its load_s), in a
free place only, and is cold until then."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qlm.config.engine_config import EngineConfig
from qlm.engine.engine_types import EngineError, ModelLoaded
from qlm.engine.model.tiers import StandbyTier
from tests.engine.helpers import engine, exact_profile


def test_a_fetch_sleeps_from_its_ready_time_in_a_free_place() -> None:
    tier = StandbyTier(2, ["a"])
    assert tier.fetch("b", ready_at_s=10.0)
    assert (tier.models, tier.fetching) == (("a",), ("b",))
    assert not tier.fetch("c", ready_at_s=10.0)  # the last place is b's
    assert not tier.fetch("b", ready_at_s=5.0)  # fetched already
    tier.settle(9.9)
    assert tier.models == ("a",)
    tier.settle(10.0)
    assert (tier.models, tier.fetching) == (("a", "b"), ())
    assert not tier.fetch("a", ready_at_s=20.0)  # asleep already
    assert not tier.fetch("c", ready_at_s=20.0)  # full: what it holds keeps its place
    assert tier.wake("a")  # a serves: its place is free
    assert tier.fetch("c", ready_at_s=20.0)
    assert (tier.models, tier.fetching) == (("b",), ("c",))


def test_a_fetch_that_replaces_a_sleeping_model_takes_its_place_at_once() -> None:
    tier = StandbyTier(2, ["a", "b"])
    assert not tier.fetch("c", ready_at_s=10.0)  # full
    assert tier.fetch("c", ready_at_s=10.0, replacing="b")
    assert (tier.models, tier.fetching) == (("a",), ("c",))  # b went cold at once
    assert not tier.wake("b")
    tier.settle(10.0)
    assert tier.models == ("a", "c")
    assert not tier.fetch("d", ready_at_s=20.0, replacing="x")  # x does not sleep here


def test_a_model_the_instance_leaves_takes_a_running_fetchs_place() -> None:
    tier = StandbyTier(3, ["a"])
    tier.fetch("b", ready_at_s=10.0)
    tier.fetch("d", ready_at_s=10.0)
    tier.sleep("c")  # full: the fetch started last gives way, a served model does not
    assert (tier.models, tier.fetching) == (("c", "a"), ("b",))
    assert not tier.wake("b")  # not there yet: a cold load, and the fetch ends
    assert tier.fetching == ()
    tier.settle(10.0)
    assert tier.models == ("c", "a")


def test_the_engine_serves_on_while_it_fetches_and_then_wakes_the_model() -> None:
    profiles = [replace(exact_profile(name, load_s=20.0), wake_s=1.0) for name in ("m", "n", "p")]
    model = engine(profiles=profiles, config=EngineConfig(standby_models=1))
    model.fetch_standby("n", 0.0)
    seen = model.observe(5.0)
    assert (seen.standby_models, seen.fetching_models, seen.standby_capacity) == ((), ("n",), 1)
    assert model.observe(20.0).standby_models == ("n",)
    model.load("n", 30.0)  # a wake: n slept since its fetch ended
    loads = [e.load_s for e in model.advance_to(60.0) if isinstance(e, ModelLoaded)]
    model.fetch_standby("p", 60.0)  # no free place: m took it when n loaded
    assert model.observe(60.0).fetching_models == ()
    model.load("m", 61.0)  # a wake; n sleeps, so the tier is full again
    model.load("p", 70.0)  # p was never fetched: cold
    loads += [e.load_s for e in model.advance_to(100.0) if isinstance(e, ModelLoaded)]
    assert loads == [1.0, 1.0, 20.0]
    with pytest.raises(EngineError, match="cannot hold"):
        model.fetch_standby("q", 100.0)


def test_a_live_fetch_sleeps_when_done_unless_its_place_went_meanwhile() -> None:
    """A live engine knows when a fetch is done only then (`fetched`), or that it failed
    (`drop_fetch`: its place is free again)."""
    tier = StandbyTier(1)
    assert tier.fetch("b", ready_at_s=float("inf"))
    tier.settle(1e9)
    assert tier.models == ()  # not done until the engine says so
    assert tier.fetched("b")
    assert (tier.models, tier.fetching) == (("b",), ())
    assert not tier.fetched("b")  # once
    tier = StandbyTier(1)
    tier.fetch("b", ready_at_s=float("inf"))
    tier.sleep("a")  # the model the instance left takes the only place
    assert not tier.fetched("b")
    assert tier.models == ("a",)
    tier = StandbyTier(1)
    tier.fetch("b", ready_at_s=float("inf"))
    tier.drop_fetch("b")
    assert tier.fetch("c", ready_at_s=float("inf"))  # the place is free again
