"""kill -9 Redis in the middle of a load and start it again on its AOF: no accepted request is
lost. Every 202 (asynchronous) and every stream that got a request id is eventually completed
or reported failed; requests refused while Redis was down were never accepted (the client was
told). The API, the controller and the agents reconnect by themselves.

appendfsync always: a 202 is only sent after the enqueue's write reached the AOF on disk, so
an accepted request survives even a crash of the host, not only of the redis-server process
(with everysec a host crash could lose up to a second of accepted requests; a process kill
loses nothing either way, the kernel keeps what was written)."""

from __future__ import annotations

import asyncio
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
    redis_for_faults,
    stream_completion,
    wait_terminal,
)
from tests.faults.report import FaultReport
from tests.redis_server import redis_server_binary

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]

TOKENS = 50  # 1 s each
RATE_PER_S = 10.0
LOAD_S = 12.0  # 3 s before the kill, 7 s down, 2 s after
KILL_AT_S = 3.0
DOWN_S = 7.0  # longer than the clients' retry window (about 6 s)
STREAM_TOKENS = 300  # 6 s: runs across the restart


async def test_accepted_requests_survive_a_redis_restart_on_aof(tmp_path: Path) -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    report = FaultReport("Redis kill -9 and restart (AOF, appendfsync always)")
    with (
        redis_for_faults(appendfsync="always") as redis_server,
        FaultPlane(fleet_config(redis_server.url), tmp_path) as plane,
    ):
        try:
            api, controller = plane.api(), plane.controller()
            agent = plane.agent("i-0", "i-1")
            await plane.ready(api, controller, agent)
            accepted: list[str] = []
            refused: Counter[str] = Counter()
            streams = [StreamResult() for _ in range(2)]
            tasks = [
                asyncio.create_task(stream_completion(api.url, STREAM_TOKENS, s)) for s in streams
            ]
            load = asyncio.create_task(
                offer_load(api.url, accepted, refused, Load(RATE_PER_S, LOAD_S, TOKENS))
            )
            await asyncio.sleep(KILL_AT_S)
            redis_server.kill9()
            await asyncio.sleep(DOWN_S)
            redis_server.restart()
            restarted_at_s, restarted_wall_s = time.monotonic(), time.time()
            await load
            await asyncio.gather(*tasks)
            report.note(f"streams ended {time.monotonic() - restarted_at_s:.1f} s after restart")
            for proc in (api, controller, agent):
                assert proc.alive, f"{proc.role} died with Redis:\n{proc.log_tail()}"
            stream_ids = [s.request_id for s in streams if s.request_id is not None]
            for rid in accepted:
                report.accept(rid, "async")
            for rid in stream_ids:
                report.accept(rid, "stream")
            records = await wait_terminal(plane, accepted + stream_ids, timeout_s=60.0)
            last_s = max(
                (r.result.finished_at_s or 0.0) - restarted_wall_s
                for r in records.values()
                if r is not None and r.result is not None
            )
            report.note(f"the last result came {last_s:.1f} s after the restart")
            rerun = sum(r is not None and r.dispatches > 1 for r in records.values())
            report.note(f"{rerun} requests ran again (a lease ran out during the outage)")
            await judge_outcomes(report, plane, accepted, streams, TOKENS, STREAM_TOKENS)
            report.note(f"refused while Redis was down (not accepted): {dict(refused)}")
            new_leader = await plane.leader()
        finally:
            await plane.aclose()

    report.check()
    assert len(accepted) >= RATE_PER_S * (LOAD_S - DOWN_S) * 0.8, "too little was accepted"
    assert new_leader is not None, "no controller leads after the restart"
