"""The queue behind Sentinel: redis+sentinel:// URLs are parsed or refused with the reason, the
queue follows a failover to the promoted replica, writes wait for the replicas asked for (and
fail when too few hold them), and the command pool makes callers wait instead of failing."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest
import redis
from pydantic import ValidationError

from qlm.config.redis_config import SentinelAddress
from qlm.config.serve_config import QueueConfig
from qlm.queue.factory import make_queue
from qlm.queue.queue_protocol import QueueUnavailableError
from qlm.queue.redis import RedisQueue, RedisQueueConfig
from qlm.queue.redis.connect import client_options, commands_client
from tests.factories import make_request
from tests.redis_sentinel import SentinelGroup
from tests.redis_server import redis_server_binary


def test_a_sentinel_url_names_hosts_service_and_db() -> None:
    address = SentinelAddress.parse("redis+sentinel://:pw@s1:26380,s2,[::1]:26381/orders/3")
    assert address.sentinels == (("s1", 26380), ("s2", 26379), ("::1", 26381))
    assert (address.service, address.db) == ("orders", 3)
    assert SentinelAddress.parse("redis+sentinel://s1/qlm").db == 0
    config = RedisQueueConfig(url="redis+sentinel://u%40x:p%2Fw@s1:26379/qlm/2")
    options = client_options(config)
    assert (options["db"], options["username"], options["password"]) == (2, "u@x", "p/w")
    assert "p%2Fw" not in repr(config)
    assert RedisQueueConfig(url="redis://cache:6379/0").sentinel is None


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+sentinel:///qlm", "at least one Sentinel host"),
        ("redis+sentinel://s1:26379", "/service[/db]"),
        ("redis+sentinel://s1:26379/qlm/zero", "must be a number"),
        ("redis+sentinel://s1:port/qlm", "host or host:port"),
        ("redis+sentinel://s1/qlm/0/extra", "/service[/db]"),
    ],
)
def test_a_bad_sentinel_url_is_refused_with_its_reason(url: str, reason: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(reason)):
        RedisQueueConfig(url=url)


def test_the_fleet_file_takes_a_sentinel_url_and_replica_acks() -> None:
    queue = QueueConfig(url="redis+sentinel://s1,s2,s3/qlm/0", replicas_to_ack=1)
    assert queue.replicas_to_ack == 1
    with pytest.raises(ValidationError, match="redis\\+sentinel://"):
        QueueConfig(url="sentinel://s1/qlm")


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelGroup]:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    with SentinelGroup(replicas=1) as group:
        yield group


@pytest.mark.redis
@pytest.mark.timeout(120)
async def test_writes_wait_for_the_replicas_asked_for(sentinels: SentinelGroup) -> None:
    held = RedisQueue(RedisQueueConfig(url=sentinels.url, key_prefix="acked:", replicas_to_ack=1))
    short = RedisQueue(
        RedisQueueConfig(
            url=sentinels.url,
            key_prefix="short:",
            replicas_to_ack=2,  # the group has one replica
            replica_ack_timeout_s=0.2,
            retries=0,
        )
    )
    try:
        await held.enqueue(make_request(id="r0"))
        replica = redis.Redis.from_url(sentinels.replicas[0].url, decode_responses=True)
        with replica:  # WAIT returned: the replica holds the record already
            assert replica.exists("acked:r:r0") == 1
        with pytest.raises(QueueUnavailableError, match="1 of 2 replicas"):
            await short.enqueue(make_request(id="r1"))
    finally:
        await held.close()
        await short.close()


@pytest.mark.redis
@pytest.mark.timeout(60)
async def test_the_command_pool_makes_callers_wait(sentinels: SentinelGroup) -> None:
    config = RedisQueueConfig(url=sentinels.url, max_connections=1, pool_timeout_s=5.0)
    client = commands_client(config)
    try:  # two blocking commands on one connection: the second waits for the first
        replies = await asyncio.gather(*(client.blpop(["nothing"], timeout=0.3) for _ in "ab"))
        assert replies == [None, None]
    finally:
        await client.aclose()


@pytest.mark.redis
@pytest.mark.timeout(120)
async def test_the_queue_follows_a_failover() -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    with SentinelGroup(replicas=1) as group:
        acked = make_queue(group.url, key_prefix="failover:", replicas_to_ack=1)
        # The promoted replica has no replica of its own, so after the failover only a
        # client that asks for no acknowledgement can write; it retries for about 12 s.
        plain = make_queue(group.url, key_prefix="failover:", retries=20)
        try:
            await acked.enqueue(make_request(id="before"))
            assert await plain.get("before") is not None
            old_port = group.kill_primary()
            group.wait_for_failover(old_port, timeout_s=30.0)
            record = await plain.get("before")
            assert record is not None, "an acknowledged request was lost with the primary"
            await plain.enqueue(make_request(id="after"))
            assert [r.id for r in await plain.queued()] == ["before", "after"]
            assert group.primary_port() != old_port
        finally:
            await acked.close()
            await plain.close()
