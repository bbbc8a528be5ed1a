"""The API's forecaster notes each arrival once for the work that passes queued requests
(qlm/api/wait_forecast.py): its own admissions, and another replica's it reads still queued
within the arrivals' window; a request queued for longer is never noted again, however long
it stays (the ids it noted are forgotten after twice the window)."""

from __future__ import annotations

from qlm.agents.queued import QueuedItem
from qlm.api.wait_forecast import NOTED_KEPT, QueueForecaster
from qlm.clock import VirtualClock
from qlm.queue.memory import MemoryQueue
from qlm.types import Fleet
from tests.factories import make_instance, make_profile, make_request

PRIORITY = {"interactive": 2, "batch-1": 1, "batch-2": 0}


async def test_each_arrival_is_noted_once_and_a_long_queued_one_never_again() -> None:
    clock = VirtualClock(0.0)
    queue = MemoryQueue()
    fleet = Fleet.of([make_instance("i0")], [make_profile("m7b")])
    api = QueueForecaster(queue, fleet, PRIORITY, clock, refresh_s=1.0, report_every_s=0.5)
    # another replica admitted a backlog at t=0 that waits for hours (batch-2)
    backlog = [
        make_request(arrival_at_s=0.0, slo_class="batch-2", ttft_s=7200.0) for _ in range(50)
    ]
    for request in backlog:
        await queue.enqueue(request)
    arrivals = api.decision.arrivals
    noted: list[str] = []
    arrived = api.decision.arrived

    def spy(model: str, item: QueuedItem) -> None:
        noted.append(item.request_id)
        arrived(model, item)

    api.decision.arrived = spy  # type: ignore[method-assign]
    await api.forecast(make_request(arrival_at_s=0.0))
    assert len(arrivals.recent("m7b", 0.0)) == 51  # the backlog once, this API's own once
    # Minutes later, past the window: the backlog is still queued but no recent arrival;
    # enough admissions since to make the forecaster forget the ids it noted.
    for k in range(NOTED_KEPT + 100):
        clock.advance_to(200.0 + k * 0.001)
        await api.forecast(make_request(arrival_at_s=clock.now_s(), max_output_tokens=8))
    for _ in range(2):  # a queue read that forgets, then one after it
        clock.advance_by(1.0)
        await api.forecast(make_request(arrival_at_s=clock.now_s(), max_output_tokens=8))
    recent = arrivals.recent("m7b", clock.now_s())
    assert len(recent) == NOTED_KEPT + 102  # this API's admissions only
    assert all(budget_s < 7200.0 for budget_s, _ in recent)
    assert len(noted) == len(set(noted)) == 51 + NOTED_KEPT + 102  # each once
