"""Redis-only: readers of many output streams woken together share one XREAD
(qlm/queue/redis/stream_reads.py), each still gets exactly its own events in order, and a
reader that leaves or a batch that fails takes no other reader with it."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from qlm.queue.records import RequestResult, StreamEvent, StreamKind
from qlm.queue.redis import RedisQueue
from qlm.queue.redis.stream_reads import START_ID, CoalescedReads
from qlm.types import RequestState
from tests.factories import make_request

pytestmark = pytest.mark.redis
STREAMS = 24
TOKENS = 5


async def _calls(client: aioredis.Redis, command: str) -> int:
    stats = await client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def _relay(
    writer: RedisQueue, reader: RedisQueue, admin: aioredis.Redis
) -> tuple[dict[str, list[str]], int]:
    """Every stream gets TOKENS tokens, one engine round at a time, while one reader per
    stream follows it: what each reader read, and the stream reads Redis served meanwhile."""
    rids = [f"r{i}" for i in range(STREAMS)]
    for rid in rids:
        await writer.enqueue(make_request(id=rid))
    await writer.pull("i0", rids, lease_s=60.0, now_s=0.0)
    read: dict[str, list[str]] = {rid: [] for rid in rids}

    async def follow(rid: str) -> None:
        async for event in reader.stream(rid, timeout_s=30.0):
            read[rid].append(event.text if event.kind is StreamKind.TOKENS else event.kind)

    followers = [asyncio.create_task(follow(rid)) for rid in rids]
    await asyncio.sleep(0.3)  # every reader subscribed and waiting
    before = await _calls(admin, "xread") + await _calls(admin, "xrange")
    for k in range(TOKENS):  # as an agent emits a round's chunks: one pipeline
        await writer.emit_many(
            [StreamEvent(rid, StreamKind.TOKENS, 1, 1.0 + k, f"{rid}.{k}", 1, k) for rid in rids]
        )
        await asyncio.sleep(0.05)
    reads = await _calls(admin, "xread") + await _calls(admin, "xrange") - before
    for rid in rids:
        await writer.complete(RequestResult(rid, RequestState.COMPLETED, "i0", finished_at_s=9.0))
    await asyncio.wait_for(asyncio.gather(*followers), 30.0)
    return read, reads


async def test_readers_woken_together_share_reads_and_keep_their_own_order(
    redis_url: str, redis_key_prefix: str
) -> None:
    writer = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix)
    reader = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix)
    admin = aioredis.Redis.from_url(redis_url)
    try:
        read, reads = await _relay(writer, reader, admin)
        for rid, got in read.items():
            assert got == [*(f"{rid}.{k}" for k in range(TOKENS)), StreamKind.DONE]
        # a read per stream per round would be STREAMS * TOKENS (120); the readers woken by
        # the same batch of a round's pokes share one (measured: 28 on a busy machine)
        assert reads < STREAMS * TOKENS / 2
    finally:
        await writer.close()
        await reader.close()
        await admin.aclose()


async def test_a_reader_that_leaves_or_a_failed_batch_spares_the_others(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        await client.xadd("s:a", {"t": "a0"})
        await client.xadd("s:b", {"t": "b0"})
        reads = CoalescedReads(client, count=16)
        leaving = asyncio.create_task(reads.after("s:a", START_ID))
        staying = asyncio.create_task(reads.after("s:b", START_ID))
        await asyncio.sleep(0)  # both joined the batch; its read has not come back
        leaving.cancel()
        entries = await asyncio.wait_for(staying, 5.0)
        assert [fields for _, fields in entries] == [{"t": "b0"}]
        with pytest.raises(asyncio.CancelledError):
            await leaving
        b1 = str(await client.xadd("s:b", {"t": "b1"}))
        behind = asyncio.create_task(reads.after("s:b", START_ID))
        ahead = asyncio.create_task(reads.after("s:b", entries[0][0]))  # same stream, same batch
        assert [f["t"] for _, f in await behind] == ["b0", "b1"]
        assert [(i, f["t"]) for i, f in await ahead] == [(b1, "b1")]  # each from its own entry
        await client.set("s:c", "not a stream")
        wrong = asyncio.create_task(reads.after("s:c", START_ID))
        right = asyncio.create_task(reads.after("s:b", b1))
        with pytest.raises(aioredis.ResponseError, match="WRONGTYPE"):
            await asyncio.wait_for(wrong, 5.0)  # the batch failed: its readers hear why
        with pytest.raises(aioredis.ResponseError, match="WRONGTYPE"):
            await asyncio.wait_for(right, 5.0)
        assert await reads.after("s:b", b1) == []  # the next batch reads again
    finally:
        await client.aclose()
