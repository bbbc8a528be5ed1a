"""The live agent's engine backlog (qlm/agents/engine_loads.py): under `auto` it admits beyond
the sequence slots as many requests as ended between two of its rounds the last time any did,
so a batch that ends together is replaced at the engine's next step; a number fixes it."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from qlm.agents.agent import Agent
from qlm.agents.engine_loads import RefillBacklog
from qlm.clock import VirtualClock
from qlm.config.agent_settings import AgentConfig
from qlm.control.plan import PlannedGroup, PublishedPlan
from qlm.engine.engine_types import FirstToken, RequestFinished
from qlm.queue.memory import MemoryQueue
from qlm.types import Fleet
from tests.factories import make_instance, make_profile, make_request
from tests.serve.engines import ScriptedEngine


def test_auto_keeps_the_count_that_ended_in_the_last_round_any_did() -> None:
    backlog = RefillBacklog("auto")
    assert backlog.size == 0  # nothing seen end yet
    done = [RequestFinished(f"r{i}", 1.0, 0.5, 8) for i in range(3)]
    backlog.saw([*done, RequestFinished("other", 1.0, 0.5, 8)], held=["r0", "r1", "r2"])
    assert backlog.size == 3  # only what this agent held counts
    backlog.saw([FirstToken("r9", 2.0)], held=["r9"])
    assert backlog.size == 3  # a round where nothing ended changes nothing
    backlog.saw([RequestFinished("r9", 3.0, 2.0, 8)], held=["r9"])
    assert backlog.size == 1
    fixed = RefillBacklog(5)
    fixed.saw(done, held=["r0", "r1", "r2"])
    assert fixed.size == 5


def _submitted_after_a_batch_ends(setting: int | Literal["auto"]) -> tuple[int, int]:
    """Two slots, eight queued requests of one group: submissions after the first round, and
    after the first two ended together (and the controller published what is left)."""

    async def run() -> tuple[int, int]:
        clock = VirtualClock(0.0)
        queue = MemoryQueue(clock=clock)
        engine = ScriptedEngine(max_num_seqs=2, runs=True)
        fleet = Fleet.of([make_instance("i0")], [make_profile("m7b")])
        settings = AgentConfig(engine_backlog=setting)
        agent = Agent(make_instance("i0"), engine, queue, fleet, clock, settings, {})
        ids = tuple(f"r{i}" for i in range(8))
        for rid in ids:
            await queue.enqueue(make_request(id=rid, slo_class="batch", prompt_tokens=100))
        group = PlannedGroup("g", "m7b", "batch", ids, (100,) * 8, (512,) * 8)
        await queue.publish_plan(PublishedPlan(0, 0.0, {"i0": ("g",)}, {"g": group}))
        await agent.step()
        first = len(engine.submitted)
        clock.advance_by(1.0)
        for rid in list(engine.running):
            del engine.running[rid]
            engine.events.append(RequestFinished(rid, 1.0, 0.5, 10, text="x"))
        left = tuple(rid for rid in ids if rid not in engine.submitted)
        group = PlannedGroup("g", "m7b", "batch", left, (100,) * len(left), (512,) * len(left))
        await queue.publish_plan(PublishedPlan(1, 1.0, {"i0": ("g",)}, {"g": group}))
        await agent.step()
        return first, len(engine.submitted)

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("setting", "expected"),
    [("auto", (2, 6)), (0, (2, 4)), (1, (3, 6))],
    ids=["auto", "none", "fixed"],
)
def test_a_batch_that_ends_together_is_replaced_with_waiting_requests_behind_it(
    setting: int | Literal["auto"], expected: tuple[int, int]
) -> None:
    # auto: two ended in the round, so two more wait in the engine behind the two that start;
    # 0: only the free slots; a fixed 1: one waits from the start, and one more each round.
    assert _submitted_after_a_batch_ends(setting) == expected
