"""GET /dashboard/late: the newest ended requests that missed their SLO, each with its cause,
its lateness and the wait the API predicted at admission; met and unfinished ones left out."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from qlm.api import create_app
from qlm.causes.late import late_rows
from qlm.clock import VirtualClock
from qlm.queue.memory import MemoryQueue
from qlm.queue.records import RequestRecord, RequestResult
from qlm.types import RequestState
from tests.api.conftest import make_settings
from tests.factories import make_request

pytestmark = pytest.mark.timeout(60)


def result(rid: str, first_s: float | None, state: RequestState, **kw: float) -> RequestResult:
    return RequestResult(
        rid,
        state,
        "gpu-0",
        dispatched_at_s=kw.get("dispatched_s", 1.0),
        first_token_at_s=first_s,
        finished_at_s=(first_s or 2.0) + 1.0,
    )


def test_rows_name_the_cause_and_the_lateness() -> None:
    request = replace(make_request(ttft_s=2.0), estimated_wait_s=0.5, estimate_basis="plan")
    met = make_request(ttft_s=20.0)
    failed = make_request(ttft_s=20.0)
    done = RequestState.COMPLETED
    records = [
        RequestRecord(request, result=result(request.id, 5.0, done, dispatched_s=4.5)),
        RequestRecord(met, result=result(met.id, 3.0, done)),
        RequestRecord(failed, result=result(failed.id, None, RequestState.FAILED)),
        RequestRecord(make_request()),  # still queued: not judged
    ]
    rows = late_rows(records)
    assert [(r["id"], r["cause"]) for r in rows] == [(request.id, "queued"), (failed.id, "failed")]
    late = rows[0]
    assert (late["ttft_s"], late["ttft_target_s"], late["late_by_s"]) == (5.0, 2.0, 3.0)
    estimate = (late["estimated_wait_s"], late["estimate_basis"], late["instance_id"])
    assert estimate == (0.5, "plan", "gpu-0")
    assert (rows[1]["ttft_s"], rows[1]["late_by_s"]) == (None, None)


async def test_the_route_lists_the_newest_late_first() -> None:
    queue = MemoryQueue()
    app = create_app(make_settings(), queue, VirtualClock(0.0))
    requests = [make_request(ttft_s=2.0, arrival_at_s=float(i)) for i in range(3)]
    for request in requests:
        await queue.enqueue(request)
    assert await queue.pull("gpu-0", [r.id for r in requests], 30.0, 1.0)
    for i, request in enumerate(requests):  # the middle one meets its target
        first_s = request.arrival_at_s + (1.0 if i == 1 else 9.0)
        assert await queue.complete(result(request.id, first_s, RequestState.COMPLETED))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        late = (await c.get("/dashboard/late")).json()
    assert [r["id"] for r in late["data"]] == [requests[2].id, requests[0].id]
    assert late["scanned"] == 3
