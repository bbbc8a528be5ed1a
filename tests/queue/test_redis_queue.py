"""What only the Redis queue promises: data outlives a client, replicas share one queue, key
prefixes separate deployments, finished requests expire, passwords and TLS work, and the
indexes (queued, leases, counts) agree with the records under concurrent use."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from qlm.control.plan import PlanForecast, PlannedGroup, PublishedPlan
from qlm.queue.factory import make_queue
from qlm.queue.queue_protocol import QueueUnavailableError, UnknownRequestError
from qlm.queue.records import RequestResult, StreamEvent, StreamKind
from qlm.queue.redis import RedisQueue, RedisQueueConfig
from qlm.queue.redis.connect import client_options
from qlm.types import RequestState
from tests.factories import make_request
from tests.redis_server import RedisServer, redis_server_binary

pytestmark = pytest.mark.redis
S = RequestState
Connect = Callable[..., Awaitable[RedisQueue]]


@pytest.fixture
async def connect(redis_url: str, redis_key_prefix: str) -> AsyncIterator[Connect]:
    """Opens RedisQueue clients on the test's server and prefix; closes them afterwards."""
    opened: list[RedisQueue] = []

    async def open_queue(**options: Any) -> RedisQueue:
        options.setdefault("key_prefix", redis_key_prefix)
        queue = RedisQueue(RedisQueueConfig(url=redis_url, **options))
        opened.append(queue)
        return queue

    yield open_queue
    for queue in opened:
        await queue.close()


def tokens(rid: str, attempt: int, offset: int, text: str) -> StreamEvent:
    return StreamEvent(rid, StreamKind.TOKENS, attempt, 1.0 + offset, text, len(text), offset)


async def test_data_survives_a_new_client(connect: Connect) -> None:
    first = await connect()
    for i in range(3):
        await first.enqueue(make_request(id=f"r{i}", arrival_at_s=float(i)))
    await first.pull("i0", ["r1"], lease_s=30.0, now_s=1.0)
    await first.emit(tokens("r1", 1, 0, "hi"))
    group = PlannedGroup("g0", "m7b", "interactive", ("r0", "r2"))
    published = await first.publish_plan(
        PublishedPlan(0, 1.0, {"i0": ("g0",)}, {"g0": group}, forecast=PlanForecast({"r0": 4.0}))
    )
    await first.close()

    second = await connect()
    assert [r.id for r in await second.queued()] == ["r0", "r2"]
    assert [(r.id, r.instance_id, r.lease_expires_at_s) for r in await second.in_flight()] == [
        ("r1", "i0", 31.0)
    ]
    assert await second.current_plan() == published
    assert (await second.counts())[S.DISPATCHED] == 1
    assert await second.complete(RequestResult("r1", S.COMPLETED, "i0", "hi", 1))
    events = [e async for e in second.stream("r1", timeout_s=1.0)]
    assert [e.kind for e in events] == [StreamKind.TOKENS, StreamKind.DONE]
    assert await second.try_lead("n1", 5.0)
    assert (await connect()).config.key_prefix == second.config.key_prefix


async def test_two_replicas_see_each_others_streams(connect: Connect) -> None:
    api_a, api_b, agent = await connect(), await connect(), await connect()
    await api_a.enqueue(make_request(id="ra"))
    await api_b.enqueue(make_request(id="rb"))
    await agent.pull("i0", ["ra", "rb"], lease_s=30.0, now_s=0.0)

    async def read(api: RedisQueue, rid: str) -> list[str]:
        return [e.text async for e in api.stream(rid, timeout_s=5.0)]

    readers = [asyncio.create_task(read(api_b, "ra")), asyncio.create_task(read(api_a, "rb"))]
    for i, word in enumerate(["x", "y", "z"]):
        await agent.emit(tokens("ra", 1, i, word))
        await agent.emit(tokens("rb", 1, i, word.upper()))
    await agent.complete(RequestResult("ra", S.COMPLETED, "i0"))
    await agent.complete(RequestResult("rb", S.COMPLETED, "i0"))
    assert await asyncio.wait_for(asyncio.gather(*readers), 5.0) == [
        ["x", "y", "z", ""],
        ["X", "Y", "Z", ""],
    ]


async def test_key_prefixes_separate_deployments(redis_url: str) -> None:
    blue = RedisQueue(RedisQueueConfig(url=redis_url, key_prefix="blue:"))
    green = RedisQueue(RedisQueueConfig(url=redis_url, key_prefix="green:"))
    try:
        await blue.enqueue(make_request(id="same"))
        await green.enqueue(make_request(id="same"))  # no DuplicateRequestError
        await blue.pull("i0", ["same"], lease_s=5.0, now_s=0.0)
        assert [r.id for r in await green.queued()] == ["same"]
        assert await green.in_flight() == ()
        assert await blue.try_lead("a", 5.0)
        assert await green.try_lead("b", 5.0)
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        keys = await client.keys("*")
        await client.aclose()
        assert all(k.startswith(("blue:", "green:")) for k in keys)
    finally:
        await blue.close()
        await green.close()


async def test_finished_requests_expire_and_their_ids_free_up(connect: Connect) -> None:
    queue = await connect(finished_ttl_s=0.3, block_chunk_s=0.05)
    await queue.enqueue(make_request(id="a"))
    await queue.enqueue(make_request(id="b"))
    await queue.pull("i0", ["b"], lease_s=5.0, now_s=0.0)
    assert await queue.cancel("a", now_s=1.0)
    waiting = asyncio.create_task(_drain(queue, "b"))  # b is live: no expiry
    await asyncio.sleep(0.6)
    assert await queue.get("a") is None
    with pytest.raises(UnknownRequestError):
        await _drain(queue, "a")
    assert await queue.get("b") is not None
    await queue.enqueue(make_request(id="a"))  # the id is free again
    assert (await queue.counts())[S.CANCELLED] == 1  # terminal counts are totals
    assert not waiting.done()
    await queue.complete(RequestResult("b", S.COMPLETED, "i0"))
    assert [e.kind for e in await asyncio.wait_for(waiting, 5.0)] == [StreamKind.DONE]


async def _drain(queue: RedisQueue, rid: str) -> list[StreamEvent]:
    return [e async for e in queue.stream(rid)]


async def test_a_reader_learns_when_its_request_expired(connect: Connect) -> None:
    queue = await connect(finished_ttl_s=0.2, block_chunk_s=0.05)
    await queue.enqueue(make_request(id="a"))
    client = aioredis.Redis.from_url(queue.config.url, decode_responses=True)
    await client.delete(f"{queue.config.key_prefix}r:a")  # as if its TTL ran out
    await client.aclose()
    with pytest.raises(UnknownRequestError):
        await asyncio.wait_for(_drain(queue, "a"), 5.0)


async def test_password_in_the_url() -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    with RedisServer(password="s3cret") as server:
        queue = make_queue(server.url, key_prefix="pw:")
        await queue.enqueue(make_request(id="a"))
        assert [r.id for r in await queue.queued()] == ["a"]
        await queue.close()
        wrong = make_queue(server.url.replace("s3cret", "nope"))
        with pytest.raises(aioredis.AuthenticationError):
            await wrong.queued()
        await wrong.close()
        override = make_queue(
            server.url.replace("s3cret", "x"), password="s3cret", key_prefix="pw:"
        )
        assert [r.id for r in await override.queued()] == ["a"]
        await override.close()


async def test_tls_with_rediss_url() -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    with RedisServer(tls=True) as server:
        assert server.url.startswith("rediss://")
        queue = make_queue(server.url, ssl_ca_certs=server.ca_file)
        await queue.enqueue(make_request(id="a"))
        assert await queue.pull("i0", ["a"], lease_s=1.0, now_s=0.0) != ()
        await queue.close()
        untrusting = make_queue(server.url)  # the self-signed certificate is not trusted
        with pytest.raises(QueueUnavailableError, match="certificate verify failed") as info:
            await untrusting.counts()
        assert isinstance(info.value.__cause__, aioredis.ConnectionError)
        await untrusting.close()


def test_config_hides_the_password_and_checks_the_url() -> None:
    config = RedisQueueConfig(url="rediss://u:hunter2@cache:6380/1", key_prefix="prod:")
    assert "hunter2" not in repr(config)
    assert config.redacted_url == "rediss://u:***@cache:6380/1"
    assert config.tls
    assert client_options(config)["ssl_cert_reqs"] == "required"
    assert config.connect_url == config.url
    override = RedisQueueConfig(url="redis://u:old@cache:6379/2", password="new")
    assert override.connect_url == "redis://cache:6379/2"
    assert (client_options(override)["username"], client_options(override)["password"]) == (
        "u",
        "new",
    )
    assert "ssl_cert_reqs" not in client_options(RedisQueueConfig(url="redis://cache"))
    with pytest.raises(ValidationError):
        RedisQueueConfig(url="http://cache:6379")
    with pytest.raises(ValidationError):
        RedisQueueConfig(url="redis://cache", prefix="x")  # type: ignore[call-arg]


async def test_indexes_agree_with_records_under_concurrent_clients(connect: Connect) -> None:
    """Four clients (agents and an API) race through pulls, requeues, expiries, completions
    and cancels; afterwards every request is in exactly the index its state says."""
    clients = [await connect() for _ in range(4)]
    ids = [f"r{i}" for i in range(120)]
    for rid in ids:
        await clients[0].enqueue(make_request(id=rid))

    async def agent(k: int) -> None:
        rng = random.Random(k)
        queue, instance = clients[k % 4], f"i{k}"
        for step in range(40):
            now_s = float(step)
            pulled = await queue.pull(instance, rng.sample(ids, 8), lease_s=3.0, now_s=now_s)
            held = [r.id for r in pulled]
            for rid in held[:2]:
                await queue.mark_running(rid, instance)
            await queue.requeue(instance, held[2:4], evicted=True, now_s=now_s)
            for rid in held[4:5]:
                await queue.complete(RequestResult(rid, S.COMPLETED, instance))
            await queue.cancel(rng.choice(ids), now_s=now_s)
            await queue.expire_leases(now_s)

    await asyncio.gather(*(agent(k) for k in range(8)))
    await _check_indexes(clients[0], ids)


async def _check_indexes(queue: RedisQueue, ids: list[str]) -> None:
    records = {rid: await queue.get(rid) for rid in ids}
    states = {rid: r.state for rid, r in records.items() if r is not None}
    assert len(states) == len(ids)
    assert {r.id for r in await queue.queued()} == {i for i, s in states.items() if s is S.QUEUED}
    live = {r.id for r in await queue.in_flight()}
    assert live == {i for i, s in states.items() if s in (S.DISPATCHED, S.RUNNING)}
    client = aioredis.Redis.from_url(queue.config.url, decode_responses=True)
    leased = set(await client.zrange(f"{queue.config.key_prefix}leases", 0, -1))
    await client.aclose()
    assert leased == live
    counts = await queue.counts()
    assert dict(counts) == {s: list(states.values()).count(s) for s in S}
    for rid, record in records.items():
        assert record is not None
        if record.state.is_terminal:
            kinds = [e.kind for e in await _drain(queue, rid)]
            assert kinds.count(StreamKind.DONE) == 1
            assert kinds[-1] is StreamKind.DONE
            assert kinds.count(StreamKind.REQUEUED) in (record.dispatches - 1, record.dispatches)


async def test_waiting_readers_never_starve_commands(connect: Connect) -> None:
    queue = await connect(max_connections=2, pool_timeout_s=2.0, block_chunk_s=0.2)
    ids = [f"r{i}" for i in range(8)]
    for rid in ids:
        await queue.enqueue(make_request(id=rid))
    readers = [asyncio.create_task(_drain(queue, rid)) for rid in ids]  # 8 blocked readers
    waiter = asyncio.create_task(queue.wait_for_change(5.0))
    await asyncio.sleep(0.1)
    assert len(await queue.pull("i0", ids, lease_s=5.0, now_s=0.0)) == len(ids)
    results = await asyncio.gather(
        *(queue.complete(RequestResult(rid, S.COMPLETED, "i0")) for rid in ids)
    )
    assert all(results)
    done = await asyncio.wait_for(asyncio.gather(*readers), 5.0)
    assert all(events[-1].kind is StreamKind.DONE for events in done)
    assert await asyncio.wait_for(waiter, 5.0)


async def test_snapshots_read_in_chunks_keep_arrival_order(connect: Connect) -> None:
    queue = await connect(snapshot_batch=3)
    for i in range(10):
        await queue.enqueue(make_request(id=f"r{i}"))
    await queue.pull("i0", ["r4", "r7"], lease_s=5.0, now_s=0.0)
    await queue.requeue("i0", ["r7"], evicted=True, now_s=1.0)
    expected = [f"r{i}" for i in range(10) if i != 4]
    assert [r.id for r in await queue.queued()] == expected
