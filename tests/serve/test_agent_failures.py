"""An engine that keeps refusing a request (a 4xx from vLLM, say) must not bounce it between
queue and engine forever: after agent.max_dispatches attempts it fails, with the reason."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from qlm.clock import VirtualClock
from qlm.control.plan import PlannedGroup, PublishedPlan
from qlm.engine.types import Aborted, EngineEvent, EngineObservation, EngineState
from qlm.queue.memory import MemoryQueue
from qlm.serve.agent import Agent
from qlm.serve.config import AgentConfig
from qlm.types import Fleet, Request, RequestState
from tests.factories import make_instance, make_profile, make_request


class RefusingEngine:
    """Aborts every request it is given, as vLLM does with a 400 (a test double)."""

    def __init__(self) -> None:
        self._events: list[EngineEvent] = []
        self.submitted = 0

    @property
    def instance_id(self) -> str:
        return "i0"

    def observe(self) -> EngineObservation:
        return EngineObservation("i0", EngineState.READY, "m7b", (), 0, 100_000, 8)

    def submit(self, request: Request) -> None:
        self.submitted += 1
        self._events.append(Aborted(request.id, 1.0, "vllm http 400: top_p must be in (0, 1]"))

    def abort(self, request_ids: Sequence[str]) -> None: ...

    def swap_out(self, request_ids: Sequence[str]) -> None: ...

    def swap_in(self, request_ids: Sequence[str]) -> None: ...

    def load_model(self, model: str) -> None: ...

    def poll(self) -> list[EngineEvent]:
        events, self._events = self._events, []
        return events


def test_a_request_the_engine_keeps_refusing_fails_after_max_dispatches() -> None:
    async def run() -> tuple[int, RequestState, str | None]:
        clock = VirtualClock(0.0)
        queue = MemoryQueue(clock=clock)
        engine = RefusingEngine()
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
        return engine.submitted, record.state, error

    submitted, state, error = asyncio.run(run())
    assert submitted == 3
    assert state is RequestState.FAILED
    assert error is not None
    assert "top_p" in error
