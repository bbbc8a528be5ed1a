"""Calls issued together (one asyncio.gather, as an agent's round issues its marks, token
chunks and results, and the control loop its reads) take effect in the order issued, each with
its own outcome, on every implementation (Redis: one pipeline, qlm/queue/redis/batching.py)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline, Redis

from qlm.queue.queue_protocol import GlobalQueue
from qlm.queue.records import StreamEvent, StreamKind
from qlm.queue.redis import RedisQueue
from qlm.types import RequestState
from tests.queue.test_contract import collect, enqueue_n, make, queue, rec, result

__all__ = ["make", "queue"]  # the fixtures, parametrized over the implementations
S = RequestState


def tokens(rid: str, text: str, offset: int) -> StreamEvent:
    return StreamEvent(rid, StreamKind.TOKENS, 1, 1.0, text, 1, offset)


async def test_a_round_issued_together_takes_effect_in_order(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 3)
    await queue.pull("i0", ["r0", "r1", "r2"], lease_s=60.0, now_s=0.0)
    outcomes = await asyncio.gather(
        queue.mark_running("r0", "i0"),
        queue.mark_running("r1", "i9"),  # not the holder: refused, the others go on
        queue.emit_many([tokens("r0", "a", 0), tokens("r1", "b", 0)]),
        queue.complete(result("r0", "i0", text="a")),  # after its token: the token stays
        queue.complete(result("r1", "i9")),  # not the holder
        queue.emit_many([tokens("r0", "late", 1)]),  # after the end: dropped
    )
    assert outcomes == [True, False, None, True, False, None]
    assert [(e.kind, e.text) for e in await collect(queue, "r0")] == [
        (StreamKind.TOKENS, "a"),
        (StreamKind.DONE, ""),
    ]
    assert ((await rec(queue, "r1")).state, (await rec(queue, "r2")).state) == (
        S.DISPATCHED,
        S.DISPATCHED,
    )


async def test_reads_issued_together_see_the_same_queue(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 2)
    queued, instances, record = await asyncio.gather(
        queue.queued(), queue.instances(), queue.get("r1")
    )
    assert ([r.id for r in queued], instances) == (["r0", "r1"], ())
    assert record is not None
    assert record.state is S.QUEUED


@pytest.mark.redis
async def test_a_round_issued_together_is_one_round_trip(
    redis_url: str, redis_key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix)
    sent: list[str] = []
    execute, command = Pipeline.execute, Redis.execute_command

    async def counted_execute(self: Pipeline, raise_on_error: bool = True) -> object:
        sent.append(f"pipeline of {len(self.command_stack)}")
        return await execute(self, raise_on_error)

    async def counted_command(self: Redis, *args: object, **options: object) -> object:
        if not isinstance(self, Pipeline):
            sent.append(str(args[0]))
        return await command(self, *args, **options)

    try:
        await enqueue_n(queue, 4)
        ids = ["r0", "r1", "r2", "r3"]
        await queue.pull("i0", ids, lease_s=60.0, now_s=0.0)
        monkeypatch.setattr(Pipeline, "execute", counted_execute)
        monkeypatch.setattr(Redis, "execute_command", counted_command)
        await asyncio.gather(
            *(queue.mark_running(rid, "i0") for rid in ids),
            queue.emit_many([tokens(rid, "x", 0) for rid in ids]),
            *(queue.complete(result(rid, "i0")) for rid in ids),
        )
        assert sent == ["pipeline of 9"]
        monkeypatch.undo()
        assert [(await rec(queue, rid)).state for rid in ids] == [S.COMPLETED] * 4
    finally:
        await queue.close()


@pytest.mark.redis
async def test_a_snapshot_reads_back_only_what_another_client_enqueued(
    redis_url: str, redis_key_prefix: str
) -> None:
    api = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix)  # the plane's own
    other = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix)  # another replica
    admin = aioredis.Redis.from_url(redis_url, decode_responses=True)

    async def scripts_run() -> int:
        stats = await admin.info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))

    try:
        requests = await enqueue_n(api, 3)
        before = await scripts_run()
        assert await api.queued() == tuple(requests)
        assert await scripts_run() == before  # nothing read back: it enqueued them itself
        assert [r.id for r in await other.queued()] == ["r0", "r1", "r2"]
        assert await scripts_run() > before  # the other client reads them
    finally:
        await api.close()
        await other.close()
        await admin.aclose()
