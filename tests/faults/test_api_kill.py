"""kill -9 the API replica that holds streaming connections: each of its streaming clients
gets a connection error at once (not a hang), a stream held by the other replica goes on
untouched, and the other replica's asynchronous API returns every result by id: for requests
submitted asynchronously through the killed replica and for the streams it was serving (their
id came in the response's x-qlm-request-id header). A replica that dies does not cancel its
requests (only a client that disconnects from a live replica does), so they run to the end."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

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

STREAM_TOKENS = 200  # 4 s of generation
ASYNC_TOKENS = 100
NUM_ASYNC = 10
CLEAN_ERROR_S = 5.0  # a cut stream must fail within this of its last chunk


async def wait_streaming(streams: list[StreamResult], min_tokens: int = 10) -> None:
    deadline = time.monotonic() + 60.0
    while any(s.tokens < min_tokens for s in streams):
        assert time.monotonic() < deadline, [s.tokens for s in streams]
        await asyncio.sleep(0.02)


async def test_a_killed_api_replica_cuts_its_streams_cleanly_and_results_stay_readable(
    fault_redis: FaultRedis, tmp_path: Path
) -> None:
    report = FaultReport("API replica kill -9")
    with FaultPlane(fleet_config(fault_redis.url), tmp_path) as plane:
        try:
            doomed, other = plane.api(), plane.api()
            controller, agent = plane.controller(), plane.agent("i-0", "i-1")
            await plane.ready(doomed, other, controller, agent)
            async with httpx.AsyncClient(base_url=doomed.url, timeout=10.0) as http:
                ids = await submit_async(http, NUM_ASYNC, max_tokens=ASYNC_TOKENS)
            cut = [StreamResult() for _ in range(2)]
            kept = StreamResult()
            tasks = [
                *(
                    asyncio.create_task(stream_completion(doomed.url, STREAM_TOKENS, s))
                    for s in cut
                ),
                asyncio.create_task(stream_completion(other.url, STREAM_TOKENS, kept)),
            ]
            await wait_streaming([*cut, kept])
            doomed.kill9()
            killed_at_s = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*tasks[:2]), CLEAN_ERROR_S)
            errors_after_s = time.monotonic() - killed_at_s
            await tasks[2]

            stream_ids = [s.request_id for s in (*cut, kept) if s.request_id is not None]
            for rid in ids:
                report.accept(rid, "async")
            for rid in stream_ids:
                report.accept(rid, "stream")
            await wait_terminal(plane, ids + stream_ids, timeout_s=60.0)
            views = await views_via(other.url, ids + stream_ids)  # the replica still up
            judge_async(report, {rid: views[rid] for rid in ids}, ASYNC_TOKENS)
            judge_stream(report, kept, STREAM_TOKENS)
            for stream in cut:  # the client saw an error; the result waits under its id
                assert stream.request_id is not None
                assert stream.error is not None, "a stream of the killed replica went on"
                assert stream.tokens < STREAM_TOKENS, "the stream had ended before the kill"
                report.note(f"{stream.request_id}: {stream.error[:80]!r} after {stream.tokens}")
                judge_async(report, {stream.request_id: views[stream.request_id]}, STREAM_TOKENS)
            report.note(f"cut streams failed {errors_after_s:.2f} s after the kill")
            for rid in ids + stream_ids:
                if (done := await plane.done_events(rid)) != 1:
                    report.duplicate(rid, f"{done} DONE events")
        finally:
            await plane.aclose()

    report.check()
