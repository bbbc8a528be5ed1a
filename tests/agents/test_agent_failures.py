"""Requests the agent cannot finish where it is: an engine that keeps refusing one (a 4xx from
vLLM, say) must not bounce it between queue and engine forever (after agent.max_dispatches
attempts it fails, with the reason), and one whose lease ran out while the agent was slow to
renew it runs again from its start, once, not twice side by side."""

from __future__ import annotations

import asyncio

import pytest

from qlm.agents.agent import Agent
from qlm.clock import VirtualClock
from qlm.config.agent_settings import AgentConfig
from qlm.control.plan import PlannedGroup, PublishedPlan
from qlm.engine.engine_types import RequestFinished
from qlm.queue.memory import MemoryQueue
from qlm.types import Fleet, Request, RequestState
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


def test_a_request_whose_lease_ran_out_is_aborted_then_pulled_again() -> None:
    async def run() -> None:
        clock = VirtualClock(0.0)
        queue = MemoryQueue(clock=clock)
        engine = ScriptedEngine()
        fleet = Fleet.of([make_instance("i0")], [make_profile("m7b")])
        agent = Agent(
            make_instance("i0"), engine, queue, fleet, clock, AgentConfig(lease_s=3.0), {}
        )
        await queue.enqueue(make_request(id="r0"))
        group = PlannedGroup("g", "m7b", "interactive", ("r0",), (500,), (512,))
        await queue.publish_plan(PublishedPlan(0, 0.0, {"i0": ("g",)}, {"g": group}))
        await agent.step()
        assert engine.submitted == ["r0"]

        clock.advance_by(4.0)  # the agent stalled: the controller requeues r0
        assert await queue.expire_leases(clock.now_s()) == ("r0",)
        await queue.publish_plan(PublishedPlan(1, 4.0, {"i0": ("g",)}, {"g": group}))
        await agent.step()  # the engine still runs r0: not pulled again; the renewal finds it lost
        assert (engine.submitted, engine.aborted) == (["r0"], [])
        await queue.publish_plan(PublishedPlan(2, 4.0, {"i0": ("g",)}, {"g": group}))
        await agent.step()  # aborted on the engine, then pulled as a new run
        assert (engine.submitted, engine.aborted) == (["r0", "r0"], ["r0"])
        assert agent.leases.lost_total == 1
        record = await queue.get("r0")
        assert record is not None
        assert (record.state, record.instance_id, record.dispatches) == (
            RequestState.DISPATCHED,
            "i0",
            2,
        )

        engine.events.append(RequestFinished("r0", clock.now_s(), clock.now_s(), 7, text="x"))
        await agent.step()
        record = await queue.get("r0")
        assert record is not None
        assert record.state is RequestState.COMPLETED
        assert record.result is not None
        assert record.result.attempt == 2

    asyncio.run(run())


async def full_engines_and_a_chat(
    broken_abort: bool = False,
) -> tuple[MemoryQueue, list[Agent], list[ScriptedEngine]]:
    """Two agents whose engines (2 slots each) are full of batch work, then a published plan
    with an interactive request queued at its head."""
    clock = VirtualClock(0.0)
    queue = MemoryQueue(clock=clock)
    instances = [make_instance("i0"), make_instance("i1")]
    fleet = Fleet.of(instances, [make_profile("m7b")])
    priority = {"batch-2": 0, "interactive": 2}
    engines = [
        ScriptedEngine(instance_id=i.id, max_num_seqs=2, runs=True, broken_abort=broken_abort)
        for i in instances
    ]
    agents = [
        Agent(i, e, queue, fleet, clock, AgentConfig(), priority)
        for i, e in zip(instances, engines, strict=True)
    ]
    batch = [
        make_request(id=f"b{k}", slo_class="batch-2", max_output_tokens=4_000, ttft_s=1e4)
        for k in range(4)
    ]
    chat = make_request(id="chat", prompt_tokens=50, ttft_s=2.0)
    for request in (*batch, chat):
        await queue.enqueue(request)

    def planned(gid: str, requests: list[Request]) -> PlannedGroup:
        fields = [tuple(getattr(r, f) for r in requests) for f in PLANNED_FIELDS]
        return PlannedGroup(gid, "m7b", requests[0].slo_class, *fields)  # type: ignore[arg-type]

    groups = {"b": planned("b", batch)}
    await queue.publish_plan(PublishedPlan(0, 0.0, {"i0": ("b",), "i1": ()}, groups))
    for _ in range(3):  # both engines fill up with batch work
        for agent in agents:
            await agent.step()
    assert [len(e.running) for e in engines] == [2, 2]
    groups["c"] = planned("c", [chat])
    await queue.publish_plan(PublishedPlan(1, 0.0, {"i0": ("c", "b"), "i1": ()}, groups))
    return queue, agents, engines


def test_of_two_agents_that_see_one_blocked_request_only_the_one_that_gets_it_preempts() -> None:
    """Both engines are full of batch work and one interactive request is queued: each agent
    sees it at the head of its model's dispatch queue and would evict a victim for it. The
    agent claims the request before it preempts, so the second one to act evicts nothing (its
    victim's work was lost for nothing before)."""

    async def run() -> tuple[list[ScriptedEngine], RequestState, str | None]:
        queue, agents, engines = await full_engines_and_a_chat()
        for agent in agents:
            await agent.step()
        record = await queue.get("chat")
        assert record is not None
        return engines, record.state, record.instance_id

    engines, state, holder = asyncio.run(run())
    assert (state, holder) == (RequestState.DISPATCHED, "i0")
    assert len(engines[0].aborted) == 1  # one victim made room
    assert engines[0].submitted[-1] == "chat"
    assert engines[1].aborted == []  # it saw the same head, but the chat was gone
    assert "chat" not in engines[1].submitted


def test_a_request_claimed_for_a_preemption_that_fails_goes_back_to_the_queue() -> None:
    async def run() -> None:
        queue, agents, engines = await full_engines_and_a_chat(broken_abort=True)
        with pytest.raises(RuntimeError, match="abort failed"):
            await agents[0].step()
        record = await queue.get("chat")
        assert record is not None
        assert record.state is RequestState.QUEUED  # not held by an agent that never ran it
        assert "chat" not in engines[0].submitted
        engines[1].broken_abort = False
        await agents[1].step()  # another instance may take it now
        record = await queue.get("chat")
        assert record is not None
        assert (record.state, record.instance_id) == (RequestState.DISPATCHED, "i1")

    asyncio.run(run())


PLANNED_FIELDS = ("id", "prompt_tokens", "max_output_tokens", "slo_class", "ttft_deadline_at_s")


def test_a_request_listed_twice_in_the_queue_is_submitted_once() -> None:
    """A virtual queue that lists a request in two groups (a plan cut while a request moved
    between groups) made one pull list it twice; the second submit raised, the round failed
    and left the rest leased but never submitted, waiting for their leases to run out (the
    agent kill fault test lost requests so)."""

    async def run() -> None:
        clock = VirtualClock(0.0)
        queue = MemoryQueue(clock=clock)
        engine = ScriptedEngine()
        fleet = Fleet.of([make_instance("i0")], [make_profile("m7b")])
        agent = Agent(make_instance("i0"), engine, queue, fleet, clock, AgentConfig(), {})
        for rid in ("r0", "r1"):
            await queue.enqueue(make_request(id=rid))
        first = PlannedGroup("g1", "m7b", "interactive", ("r0",), (500,), (512,))
        second = PlannedGroup("g2", "m7b", "interactive", ("r0", "r1"), (500, 500), (512, 512))
        groups = {"g1": first, "g2": second}
        await queue.publish_plan(PublishedPlan(0, 0.0, {"i0": ("g1", "g2")}, groups))
        await agent.step()
        assert engine.submitted == ["r0", "r1"]
        for rid in ("r0", "r1"):
            record = await queue.get(rid)
            assert record is not None
            assert (record.state, record.dispatches) == (RequestState.DISPATCHED, 1)

    asyncio.run(run())
