"""kill -9 the controller while a backlog is being served, submit more work while it is down,
then start a new controller: it takes the leader lease once the dead one's runs out, rebuilds
its plan from what Redis holds (queued requests, instance reports, the plan epoch) and every
request completes exactly once. Work planned before the kill keeps flowing meanwhile (agents
serve the last published plan); work submitted while no controller runs waits unplanned."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from qlm.types import RequestState
from tests.faults.harness import (
    FaultPlane,
    FaultRedis,
    StreamResult,
    fleet_config,
    judge_async,
    judge_stream,
    stream_completion,
    submit_async,
    views_via,
    wait_terminal,
)
from tests.faults.report import FaultReport

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]

TOKENS = 100  # 2 s each at 20 ms per token; 16 run at once on the two instances
BACKLOG = 24
LATE = 8
STREAM_TOKENS = 200


async def wait_completed(plane: FaultPlane, ids: list[str], count: int) -> None:
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        records = await plane.records(ids)
        if sum(r is not None and r.state is RequestState.COMPLETED for r in records) >= count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"fewer than {count} of the backlog completed")


async def test_a_restarted_controller_resumes_planning_from_redis(
    fault_redis: FaultRedis, tmp_path: Path
) -> None:
    report = FaultReport("controller kill -9 and restart")
    with FaultPlane(fleet_config(fault_redis.url), tmp_path) as plane:
        try:
            api, first = plane.api(), plane.controller()
            agent = plane.agent("i-0", "i-1")
            await plane.ready(api, first, agent)
            async with httpx.AsyncClient(base_url=api.url, timeout=10.0) as http:
                backlog = await submit_async(http, BACKLOG, max_tokens=TOKENS)
                streams = [StreamResult() for _ in range(2)]
                tasks = [
                    asyncio.create_task(stream_completion(api.url, STREAM_TOKENS, s))
                    for s in streams
                ]
                await wait_completed(plane, backlog, 4)
                old_leader, old_epoch = await plane.leader(), await plane.plan_epoch()
                first.kill9()
                late = await submit_async(http, LATE, max_tokens=TOKENS, first_index=BACKLOG)
            await asyncio.sleep(1.5)  # the old leader lease (1 s) has run out; nobody plans
            unplanned = await plane.records(late)
            assert all(r is not None and r.state is RequestState.QUEUED for r in unplanned)
            assert await plane.leader() is None

            second = plane.controller()
            await plane.ready(second)
            restarted_at_s = time.monotonic()
            await asyncio.gather(*tasks)
            ids = backlog + late
            stream_ids = [s.request_id for s in streams if s.request_id is not None]
            for rid in ids:
                report.accept(rid, "async")
            for rid in stream_ids:
                report.accept(rid, "stream")
            await wait_terminal(plane, ids + stream_ids, timeout_s=60.0)
            report.note(f"all ended {time.monotonic() - restarted_at_s:.1f} s after the restart")
            new_leader, new_epoch = await plane.leader(), await plane.plan_epoch()
            for stream in streams:
                judge_stream(report, stream, STREAM_TOKENS)
            judge_async(report, await views_via(api.url, ids), TOKENS)
            for rid in ids + stream_ids:
                if (done := await plane.done_events(rid)) != 1:
                    report.duplicate(rid, f"{done} DONE events")
        finally:
            await plane.aclose()

    report.check()
    assert new_leader not in (None, old_leader), "the new controller did not take the lead"
    assert new_epoch > old_epoch, "plan epochs must keep growing across controllers"
