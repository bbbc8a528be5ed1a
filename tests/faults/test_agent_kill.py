"""kill -9 agents (an emulated engine lives in its agent's process, so it dies too).

One agent dies idle before any load: the control loop must stop planning work onto its
instance (its last status report still says "idle") once it has been silent for
`controller.instance_timeout_s`. Another dies while it streams: the requests it held go back
to the queue when their leases run out, the last agent runs them, and every client sees each
request end exactly once: streams carry every token once (the re-run starts at token 0; the
API skips what the client already has), asynchronous requests show one result, and each
request's output stream holds a single DONE event."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from tests.faults.harness import (
    LEASE_S,
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

STREAM_TOKENS = 150  # 3 s of generation at 20 ms per token
ASYNC_TOKENS = 100
NUM_STREAMS = 4
NUM_ASYNC = 12
INSTANCES = ("i-0", "i-1", "i-2")


async def instance_mid_stream(
    plane: FaultPlane, streams: list[StreamResult], timeout_s: float = 60.0
) -> str:
    """The instance running a stream whose client has some tokens but not most of them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for stream in streams:
            if stream.request_id is None or not 5 <= stream.tokens <= STREAM_TOKENS // 2:
                continue
            record = await plane.queue.get(stream.request_id)
            if record is not None and record.instance_id is not None:
                return record.instance_id
        await asyncio.sleep(0.02)
    raise AssertionError(f"no stream mid-generation: {[s.tokens for s in streams]}")


async def test_killed_agents_requests_complete_once_on_another_agent(
    fault_redis: FaultRedis, tmp_path: Path
) -> None:
    report = FaultReport("agent kill -9")
    config = fleet_config(fault_redis.url, count=len(INSTANCES))
    with FaultPlane(config, tmp_path) as plane:
        try:
            api, controller = plane.api(), plane.controller()
            agents = {i: plane.agent(i) for i in INSTANCES}
            await plane.ready(api, controller, *agents.values())
            agents["i-0"].kill9()  # dies idle: its last report says it has room

            streams = [StreamResult() for _ in range(NUM_STREAMS)]
            tasks = [
                asyncio.create_task(stream_completion(api.url, STREAM_TOKENS, s)) for s in streams
            ]
            async with httpx.AsyncClient(base_url=api.url, timeout=10.0) as http:
                ids = await submit_async(http, NUM_ASYNC, max_tokens=ASYNC_TOKENS)
            victim = await instance_mid_stream(plane, streams)
            held = [r.id for r in await plane.queue.in_flight() if r.instance_id == victim]
            agents[victim].kill9()
            killed_at_s = time.monotonic()
            report.note(f"killed i-0 idle, then the agent of {victim} holding {len(held)}")

            await asyncio.sleep(LEASE_S + 1.0)  # its leases run out; then a second wave
            async with httpx.AsyncClient(base_url=api.url, timeout=10.0) as http:
                ids += await submit_async(
                    http, NUM_ASYNC, max_tokens=ASYNC_TOKENS, first_index=NUM_ASYNC
                )
            await asyncio.gather(*tasks)
            stream_ids = [s.request_id for s in streams if s.request_id is not None]
            for rid in ids:
                report.accept(rid, "async")
            for rid in stream_ids:
                report.accept(rid, "stream")
            records = await wait_terminal(plane, ids + stream_ids, timeout_s=60.0)
            report.note(f"all ended {time.monotonic() - killed_at_s:.1f} s after the kill")
            for stream in streams:
                judge_stream(report, stream, STREAM_TOKENS)
            judge_async(report, await views_via(api.url, ids), ASYNC_TOKENS)
            for rid in ids + stream_ids:
                if (done := await plane.done_events(rid)) != 1:
                    report.duplicate(rid, f"{done} DONE events")
        finally:
            await plane.aclose()

    report.check()
    assert held, "the victim held nothing when it was killed"
    assert any(s.request_id in held for s in streams), "no stream was cut by the kill"
    survivor = ({"i-1", "i-2"} - {victim}).pop()
    for rid in held:  # re-dispatched and finished by the survivor
        record = records[rid]
        assert record is not None
        assert record.result is not None
        assert record.dispatches >= 2, rid
        assert record.result.instance_id == survivor, rid
