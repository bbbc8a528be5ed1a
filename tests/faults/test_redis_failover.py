"""kill -9 the Redis primary in the middle of a load, with two replicas and three Sentinels
running: the Sentinels promote a replica, every qlm process follows them to it, and no
accepted request is lost or delivered twice. It is never restarted: the queue lives on in the
replica.

The queue URL is redis+sentinel:// and `queue.replicas_to_ack: 1`: each enqueue, pull,
requeue, result and output event waits (Redis WAIT) until a replica holds it before it counts,
so the 202 of an accepted request means a replica has it, and a request handed to an instance
cannot reappear as queued on the promoted replica. Two replicas, because after the failover
the promoted one needs a replica of its own for writes to be acknowledged again (Sentinel
points the other at it). Reported: the failover's length as the Sentinels see it, the
longest pause between two accepted requests (what clients saw of it), requests refused
meanwhile (never accepted, and the client was told), and requests that ran twice because
their lease ran out.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.faults.harness import (
    FaultPlane,
    Load,
    StreamResult,
    fleet_config,
    judge_outcomes,
    offer_load,
    stream_completion,
    wait_terminal,
)
from tests.faults.report import FaultReport
from tests.redis_sentinel import SentinelGroup
from tests.redis_server import redis_server_binary

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(300)]

LOAD = Load(rate_per_s=10.0, duration_s=12.0, tokens=50)  # 1 s of decoding each
KILL_AT_S = 3.0
STREAM_TOKENS = 300  # 6 s: runs across the failover


async def test_accepted_requests_survive_losing_the_primary(tmp_path: Path) -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    report = FaultReport("Redis primary kill -9, Sentinel failover to a replica (WAIT 1)")
    with SentinelGroup(replicas=2) as group:
        queue = {"url": group.url, "key_prefix": "faults:", "replicas_to_ack": 1}
        with FaultPlane(fleet_config(group.url, queue=queue), tmp_path) as plane:
            try:
                await run_failover(plane, group, report)
            finally:
                await plane.aclose()
    report.check()


async def run_failover(plane: FaultPlane, group: SentinelGroup, report: FaultReport) -> None:
    api, controller = plane.api(), plane.controller()
    agent = plane.agent("i-0", "i-1")
    await plane.ready(api, controller, agent)
    accepted: list[str] = []
    accepted_at_s: list[float] = []
    refused: Counter[str] = Counter()
    streams = [StreamResult() for _ in range(2)]
    tasks = [asyncio.create_task(stream_completion(api.url, STREAM_TOKENS, s)) for s in streams]
    load = asyncio.create_task(offer_load(api.url, accepted, refused, LOAD, accepted_at_s))
    await asyncio.sleep(KILL_AT_S)
    killed_at_s = time.monotonic()
    old_port = group.kill_primary()
    failover_s = await asyncio.to_thread(group.wait_for_failover, old_port, 60.0)
    report.note(f"the Sentinels named a new primary {failover_s:.1f} s after the kill")
    await load
    await asyncio.gather(*tasks)
    for proc in (api, controller, agent):
        assert proc.alive, f"{proc.role} died with the primary:\n{proc.log_tail()}"
    after = [at_s - killed_at_s for at_s in accepted_at_s if at_s > killed_at_s + failover_s]
    assert after, f"nothing was accepted after the failover; refused: {dict(refused)}"
    times = sorted(accepted_at_s)
    gap_s = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
    report.note(f"the longest wait between two accepted requests: {gap_s:.1f} s")
    report.note(f"refused meanwhile (not accepted, the client was told): {dict(refused)}")
    stream_ids = [s.request_id for s in streams if s.request_id is not None]
    for rid in accepted:
        report.accept(rid, "async")
    for rid in stream_ids:
        report.accept(rid, "stream")
    records = await wait_terminal(plane, accepted + stream_ids, timeout_s=90.0)
    rerun = sum(r is not None and r.dispatches > 1 for r in records.values())
    report.note(f"{rerun} requests ran again (a lease ran out during the failover)")
    await judge_outcomes(report, plane, accepted, streams, LOAD.tokens, STREAM_TOKENS)
    assert len(accepted) >= LOAD.rate_per_s * KILL_AT_S * 0.8, "too little was accepted"
    assert await plane.leader() is not None, "no controller leads after the failover"
