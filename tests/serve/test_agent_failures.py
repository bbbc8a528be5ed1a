"""An engine that keeps refusing a request (a 4xx from vLLM, say) must not bounce it between
queue and engine forever: after agent.max_dispatches attempts it fails, with the reason."""

from __future__ import annotations

import asyncio

from qlm.clock import VirtualClock
from qlm.control.plan import PlannedGroup, PublishedPlan
from qlm.queue.memory import MemoryQueue
from qlm.serve.agent import Agent
from qlm.serve.config import AgentConfig
from qlm.types import Fleet, RequestState
from tests.factories import make_instance, make_profile, make_request
from tests.serve.engines import ScriptedEngine


def test_a_request_the_engine_keeps_refusing_fails_after_max_dispatches() -> None:
    async def run() -> tuple[int, RequestState, str | None]:
        clock = VirtualClock(0.0)
        queue = MemoryQueue(clock=clock)
        engine = ScriptedEngine(refuse=10**6, reason="vllm http 400: top_p must be in (0, 1]")
        fleet = Fleet.of([make_instance("i0")], [make_profile("m7b")])
        settings = AgentConfig(max_dispatches=3)
        agent = Agent(make_instance("i0"), engine, queue, fleet, clock, settings, {})
        await queue.enqueue(make_request(id="r0"))
        group = PlannedGroup("g", "m7b", "interactive", ("r0",), (500,), (512,))
        await queue.publish_plan(PublishedPlan(0, 0.0, {"i0": ("g",)}, {"g": group}))
        for _ in range(10):
            await agent.step()
        record = await queue.get("r0")
        assert record is not None
        error = record.result.error if record.result else None
        return len(engine.submitted), record.state, error

    submitted, state, error = asyncio.run(run())
    assert submitted == 3
    assert state is RequestState.FAILED
    assert error is not None
    assert "top_p" in error
