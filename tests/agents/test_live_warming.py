"""The standby tiers filled live (qlm/agents/live_warming.py): the control loop notes arrivals and
names a fetch for each tiered instance in the plan it publishes; each agent starts its own on
its (emulated) engine; instances without a tier fetch nothing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from qlm.agents.live_warming import LiveWarming, start_fetch
from qlm.clock import WallClock
from qlm.config.engine_config import EngineConfig
from qlm.config.serve_config import ServeConfig
from qlm.control.plan import AgentNotes, PublishedPlan
from qlm.engine.emulated import EmulatedEngine
from qlm.engine.engine_types import EngineState
from qlm.queue.records import InstanceStatus
from qlm.serve.runtime import Plane, running_plane
from qlm.types import Request
from tests.serve.test_plane import PROFILE

pytestmark = pytest.mark.timeout(120)

MODELS = ("m-a", "m-b")


def config(standby: int, **engine: Any) -> ServeConfig:
    profile = {**PROFILE, "load_s": 4.0, "wake_s": 0.1}
    return ServeConfig.model_validate({
        "qlm": {
            "slo_classes": [{"name": "interactive", "ttft_s": 1.0, "priority": 1}],
            "planner": {"policy": "edf"},
            "control": {"tick_s": 0.05},
        },
        "api": {"port": 0},
        "agent": {"poll_s": 0.02},
        "engine": {"kind": "emulated", "speedup": 4.0, "output_length": "cap",
                   "standby_models": standby, **engine},
        "models": [{"name": m} for m in MODELS],
        "fleet": {
            "packaged_profiles": False,
            "profiles": [{"model": m, **profile} for m in MODELS],
            "instances": [{"id": f"i-{m}", "gpu_type": "A100", "model": m} for m in MODELS],
        },
    })  # fmt: skip


def client_of(plane: Plane) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{plane.port}", timeout=30)


async def traffic(client: httpx.AsyncClient, rounds: int) -> None:
    """Short interactive completions of both models, a round every 0.1 s."""

    async def one(model: str, i: int) -> None:
        body = {"model": model, "prompt": f"hello {i}", "max_tokens": 2}
        response = await client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text

    sent = []
    for i in range(rounds):
        sent += [asyncio.ensure_future(one(model, i)) for model in MODELS]
        await asyncio.sleep(0.1)
    await asyncio.gather(*sent)


async def standby_seen(plane: Plane, timeout_s: float) -> dict[str, tuple[str, ...]]:
    """Instance id -> the models its tier holds as its agent reports them, once every
    instance reports one, or at the timeout."""
    end = time.monotonic() + timeout_s
    while True:
        held = {s.instance_id: s.standby_models for s in await plane.queue.instances()}
        if all(held.get(f"i-{m}") for m in MODELS) or time.monotonic() > end:
            return held
        await asyncio.sleep(0.1)


async def test_each_tier_fetches_the_model_another_instance_serves() -> None:
    """Each instance serves one model and both get urgent traffic: a cold load (4 s) would
    leave the other model's arrivals without an instance, a wake (0.1 s) would not, so each
    tier holds the model the other instance serves, fetched while it serves its own."""
    async with running_plane(config(standby=1)) as plane, client_of(plane) as client:
        await traffic(client, 10)
        held = await standby_seen(plane, timeout_s=10.0)
    assert held == {"i-m-a": ("m-b",), "i-m-b": ("m-a",)}
    assert [a.counters.fetches for a in plane.agents] == [1, 1]
    assert [a.counters.swaps for a in plane.agents] == [0, 0]  # fetched, not served


async def test_without_a_tier_nothing_is_fetched() -> None:
    async with running_plane(config(standby=0)) as plane, client_of(plane) as client:
        await traffic(client, 5)
        plan = await plane.queue.current_plan()
    assert plan is not None
    assert dict(plan.notes.standby_fetches) == {}
    assert [a.counters.fetches for a in plane.agents] == [0, 0]


def fetching(epoch: int, fetches: dict[str, tuple[str, str | None]]) -> PublishedPlan:
    """An empty plan that tells agents to fetch these models into their standby tiers."""
    return PublishedPlan(epoch, 0.0, {}, {}, notes=AgentNotes(standby_fetches=fetches))


def request(rid: str, model: str, at_s: float) -> Request:
    return Request(rid, model, 8, 2, "interactive", at_s, at_s + 1.0)


def test_the_loop_counts_an_arrival_once_and_only_within_the_window() -> None:
    cfg = config(standby=1)
    warming = LiveWarming(cfg.fleet(), window_s=60.0)
    statuses = [_status(f"i-{m}", m) for m in MODELS]
    up = {s.instance_id for s in statuses}
    assert warming.round([], statuses, up, 100.0) == {}  # no arrivals: nothing worth it
    seen = [request(f"r{i}", "m-b", 90.0 + i) for i in range(5)]
    old = request("old", "m-a", 10.0)  # before the window: not an arrival any more
    fetches = warming.round([*seen, old], statuses, up, 100.0)
    assert fetches == {"i-m-a": ("m-b", None)}
    again = warming.round([*seen, old], statuses, up, 100.0)  # the same queue again
    assert again == fetches
    assert warming.round([], statuses, up - {"i-m-a"}, 100.0) == {}  # i-m-a is down


def _status(instance_id: str, model: str) -> InstanceStatus:
    return InstanceStatus(instance_id, "ready", model, 0.0, 0, 0, 1, 0.0, standby_capacity=1)


async def test_an_agent_skips_a_stale_or_busy_directive() -> None:
    fleet = config(standby=1).fleet()
    engine = EmulatedEngine(fleet.instance("i-m-a"), fleet.profiles.values(), WallClock(),
                            config=EngineConfig(standby_models=1), speedup=4.0)  # fmt: skip
    async with engine:
        plan = fetching(1, {"i-m-a": ("m-a", None)})
        assert not start_fetch(engine, "i-m-a", plan)  # it serves m-a already
        plan = fetching(2, {"i-m-a": ("m-b", None)})
        assert not start_fetch(engine, "i-m-b", plan)  # not this instance's
        assert start_fetch(engine, "i-m-a", plan)
        assert engine.observe().fetching_models == ("m-b",)
        assert not start_fetch(engine, "i-m-a", plan)  # one fetch at a time
        assert engine.observe().state is EngineState.READY


def test_a_standby_tier_on_other_engines_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"engine.standby_models[\s\S]*engine.vllm"):
        config(standby=1, kind="vllm")


def test_the_fetches_travel_in_the_stored_plan() -> None:
    fetches = {"i-m-a": ("m-b", None), "i-m-b": ("m-c", "m-a")}
    plan = fetching(3, fetches)
    assert dict(PublishedPlan.from_json(plan.to_json()).notes.standby_fetches) == fetches
    assert (
        dict(PublishedPlan.from_json(PublishedPlan(4, 0.0, {}, {}).to_json()).notes.standby_fetches)
        == {}
    )


def test_an_agents_report_carries_its_tier() -> None:
    status = InstanceStatus(
        "i", "ready", "m-a", 0.0, 0, 0, 1, 0.0, standby_models=("m-b",),
        fetching_models=("m-c",), standby_capacity=2,
    )  # fmt: skip
    assert InstanceStatus.from_json(status.to_json()) == status
