"""When an idle agent runs its next round: a fresh plane's agent, whose rounds found no plan
yet, wakes on the first plan instead of sleeping out `poll_s` (a fresh plane's first burst
waited for it)."""

from __future__ import annotations

import asyncio

from qlm.agents.agent import Agent
from qlm.clock import VirtualClock
from qlm.config.agent_settings import AgentConfig
from qlm.control.plan import PlannedGroup, PublishedPlan
from qlm.queue.memory import MemoryQueue
from qlm.types import Fleet
from tests.factories import make_instance, make_profile, make_request
from tests.serve.engines import ScriptedEngine


def test_an_agent_that_found_no_plan_wakes_on_the_first_one() -> None:
    async def run() -> list[str]:
        clock = VirtualClock(0.0)
        queue = MemoryQueue(clock=clock)
        engine = ScriptedEngine()
        fleet = Fleet.of([make_instance("i0")], [make_profile("m7b")])
        settings = AgentConfig(poll_s=30.0)
        agent = Agent(make_instance("i0"), engine, queue, fleet, clock, settings, {})
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        await asyncio.sleep(0.2)  # its first round finds no plan
        await queue.enqueue(make_request(id="r0"))
        group = PlannedGroup("g", "m7b", "interactive", ("r0",), (500,), (512,))
        await queue.publish_plan(PublishedPlan(0, 0.0, {"i0": ("g",)}, {"g": group}))
        for _ in range(100):  # 2 s at most, far below poll_s
            if engine.submitted:
                break
            await asyncio.sleep(0.02)
        stop.set()
        await asyncio.wait_for(running, 10.0)
        return engine.submitted

    assert asyncio.run(run()) == ["r0"]
