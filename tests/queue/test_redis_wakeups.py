"""Redis-only: stream readers and plan waiters must not go deaf when their connection drops
(redis-py reconnects and re-subscribes on its own; the wake-ups must follow)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from qlm.control.plan import PublishedPlan
from qlm.queue.records import RequestResult, StreamEvent, StreamKind
from qlm.queue.redis import RedisQueue
from qlm.types import RequestState
from tests.factories import make_request

pytestmark = pytest.mark.redis


async def test_stream_reader_hears_tokens_after_its_subscription_is_killed(
    redis_url: str, redis_key_prefix: str
) -> None:
    writer = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix)
    reader = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix, block_chunk_s=30.0)
    try:
        await writer.enqueue(make_request(id="r0"))
        await writer.pull("i0", ["r0"], lease_s=60.0, now_s=0.0)
        arrived: list[tuple[str, float]] = []

        async def read() -> None:
            async for event in reader.stream("r0", timeout_s=60.0):
                arrived.append((event.text, time.monotonic()))
                if event.kind is StreamKind.DONE:
                    return

        task = asyncio.create_task(read())
        await asyncio.sleep(0.3)
        sent = time.monotonic()
        # killed through the writer's open connection, then the token at once: it is
        # published before the reader's subscription is back
        await writer._redis.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        await writer.emit(StreamEvent("r0", StreamKind.TOKENS, 1, 1.0, "b", 1, 0))
        for _ in range(60):  # nothing else is published meanwhile: no later poke helps
            if arrived:
                break
            await asyncio.sleep(0.05)
        assert [text for text, _ in arrived] == ["b"]  # within 3 s, not the 30 s re-read
        assert arrived[0][1] - sent < 3.0
        await writer.complete(RequestResult("r0", RequestState.COMPLETED, "i0", finished_at_s=2.0))
        await asyncio.wait_for(task, 20.0)
    finally:
        await writer.close()
        await reader.close()


async def test_batched_writes_survive_a_server_that_lost_its_scripts(
    redis_url: str, redis_key_prefix: str
) -> None:
    queue = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix)
    try:
        await queue.enqueue(make_request(id="warm"))  # scripts loaded
        await queue._redis.script_flush()  # as after a restart without persistence of scripts
        await asyncio.gather(*(queue.enqueue(make_request(id=f"e{i}")) for i in range(5)))
        await queue.pull("i0", ["e0", "e1"], lease_s=60.0, now_s=0.0)
        await queue._redis.script_flush()
        events = [StreamEvent(rid, StreamKind.TOKENS, 1, 1.0, rid, 1, 0) for rid in ("e0", "e1")]
        await queue.emit_many(events)
        assert {r.id for r in await queue.queued()} == {"warm", "e2", "e3", "e4"}
        for rid in ("e0", "e1"):
            await queue.complete(
                RequestResult(rid, RequestState.COMPLETED, "i0", finished_at_s=2.0)
            )
            got = [e async for e in queue.stream(rid, timeout_s=5.0)]
            assert [e.text for e in got[:-1]] == [rid]
    finally:
        await queue.close()


async def test_a_plan_the_watcher_heard_of_is_read_in_one_round_trip(
    redis_url: str, redis_key_prefix: str
) -> None:
    """After every publish each agent asks for the plan: once its watcher has heard the new
    epoch, the plan is read at once (HMGET), not after an HGET of the epoch that would only
    confirm it; while nothing new was heard, asking costs nothing."""
    planner = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix)
    agent = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix)
    admin = aioredis.Redis.from_url(redis_url)

    async def calls() -> tuple[int, int]:
        stats = await admin.info("commandstats")
        hget, hmget = (
            int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hget", "hmget")
        )
        return hget, hmget

    try:
        first = await planner.publish_plan(PublishedPlan(0, 1.0, {}, {}))
        assert await agent.wait_for_plan(0, timeout_s=5.0)  # the watcher runs and heard it
        assert await agent.current_plan() == first
        second = await planner.publish_plan(PublishedPlan(0, 2.0, {}, {}))
        assert await agent.wait_for_plan(first.epoch, timeout_s=5.0)
        before = await calls()
        assert await agent.current_plan() == second
        assert await agent.current_plan() == second  # nothing newer heard: from the cache
        after = await calls()
        assert (after[0] - before[0], after[1] - before[1]) == (0, 1)
    finally:
        await planner.close()
        await agent.close()
        await admin.aclose()
