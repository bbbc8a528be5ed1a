"""What an agent knows of a request it ends, for its miss cause: which attempt ended it, and how
much of its queue wait its instance spent loading the model it served it on. The recorder turns
that into qlm_slo_missed_total{cause}."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from qlm.agents.actions import LoadModel
from qlm.agents.agent import Agent
from qlm.clock import VirtualClock
from qlm.config.agent_settings import AgentConfig
from qlm.control.plan import PlannedGroup, PublishedPlan
from qlm.engine.engine_types import ModelLoaded, RequestFinished
from qlm.metrics import PlaneMetrics
from qlm.queue.memory import MemoryQueue
from qlm.queue.records import RequestResult
from qlm.types import Fleet, Request
from tests.factories import make_instance, make_profile, make_request
from tests.serve.engines import ScriptedEngine


class Setup:
    def __init__(self, engine: ScriptedEngine, clock: VirtualClock) -> None:
        self.clock = clock
        self.queue = MemoryQueue(clock=clock)
        self.metrics = PlaneMetrics(
            CollectorRegistry(), clock, slo_classes=("interactive",), models=("m7b", "m13b")
        )
        fleet = Fleet.of([make_instance("i0")], [make_profile("m7b"), make_profile("m13b")])
        settings = AgentConfig(max_dispatches=3)
        self.agent = Agent(
            make_instance("i0"), engine, self.queue, fleet, clock, settings, {}, self.metrics
        )

    async def plan(self, request: Request) -> None:
        await self.queue.enqueue(request)
        group = PlannedGroup("g", "m7b", "interactive", (request.id,), (500,), (512,))
        await self.queue.publish_plan(PublishedPlan(0, 0.0, {"i0": ("g",)}, {"g": group}))

    async def result(self, request_id: str) -> RequestResult:
        record = await self.queue.get(request_id)
        assert record is not None
        assert record.result is not None
        return record.result

    def missed(self, cause: str) -> float | None:
        labels = {"model_name": "m7b", "slo_class": "interactive", "instance_id": "i0"}
        return self.metrics.registry.get_sample_value(
            "qlm_slo_missed_total", {**labels, "cause": cause}
        )


def test_a_wait_spent_loading_the_model_is_model_load() -> None:
    async def run() -> tuple[RequestResult, Setup]:
        engine, clock = ScriptedEngine(), VirtualClock(0.0)
        s = Setup(engine, clock)
        await s.plan(make_request(id="r0", arrival_at_s=0.0, ttft_s=2.0))
        clock.advance_to(5.0)
        await s.agent._apply([LoadModel("i0", "m7b")])  # this agent starts the load at 5 s
        # The engine's load_s may be on another clock (an emulated engine's): the agent's
        # own start time counts. Loading from 5 s to 30 s of a wait from 0 s to 40 s.
        engine.events.append(ModelLoaded("m7b", at_s=30.0, load_s=999.0))
        engine.events.append(ModelLoaded("m13b", at_s=31.0, load_s=30.0))  # another model
        clock.advance_to(40.0)
        await s.agent.step()
        assert engine.submitted == ["r0"]
        engine.events.append(RequestFinished("r0", 41.0, first_token_at_s=40.5, output_tokens=3))
        await s.agent.step()
        return await s.result("r0"), s

    result, s = asyncio.run(run())
    assert result.attempt == 1
    assert result.dispatched_at_s == 40.0
    assert result.load_wait_s == 25.0
    assert s.missed("model_load") == 1
    assert s.missed("queued") is None


def test_a_request_refused_once_then_served_late_is_evicted() -> None:
    async def run() -> tuple[RequestResult, Setup]:
        engine, clock = ScriptedEngine(refuse=1), VirtualClock(10.0)
        s = Setup(engine, clock)
        await s.plan(make_request(id="r0", arrival_at_s=0.0, ttft_s=2.0))
        for _ in range(5):
            await s.agent.step()
        assert engine.submitted == ["r0", "r0"]
        engine.events.append(RequestFinished("r0", 11.0, first_token_at_s=10.5, output_tokens=3))
        await s.agent.step()
        return await s.result("r0"), s

    result, s = asyncio.run(run())
    assert result.attempt == 2
    assert result.load_wait_s == 0.0
    assert s.missed("evicted") == 1
    assert s.missed("queued") is None


def test_a_request_the_engine_keeps_refusing_is_a_failed_miss() -> None:
    async def run() -> tuple[RequestResult, Setup]:
        engine, clock = ScriptedEngine(refuse=10), VirtualClock(10.0)
        s = Setup(engine, clock)
        await s.plan(make_request(id="r0", arrival_at_s=0.0, ttft_s=2.0))
        for _ in range(10):
            await s.agent.step()
        return await s.result("r0"), s

    result, s = asyncio.run(run())
    assert result.attempt == 3
    assert s.missed("failed") == 1
    evaluated = s.metrics.registry.get_sample_value(
        "qlm_slo_evaluated_total",
        {"model_name": "m7b", "slo_class": "interactive", "instance_id": "i0"},
    )
    assert evaluated == 1
