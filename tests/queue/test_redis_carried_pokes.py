"""Redis-only: a stream's poke carries its entry (qlm/queue/redis/pokes.py), so a reader that
follows a stream takes each entry from its poke instead of reading the stream; a lost poke, a
poke without its entry or an overlapping read still gives every event once, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis

from qlm.queue.records import RequestResult, StreamEvent, StreamKind
from qlm.queue.redis import RedisQueue
from qlm.queue.redis.pokes import MAX_CARRIED, StreamPokes, Watch, carried_entry
from qlm.types import RequestState
from tests.factories import make_request

TOKENS = 8


def test_a_watch_gives_the_carried_entries_that_follow_the_last_one() -> None:
    watch = Watch()
    watch.poked(("0-0", "1-0", {"x": "a"}))
    assert watch.take("0-0") is None  # a new watch reads first: entries before it began
    watch.poked(("1-0", "2-0", {"x": "b"}))
    watch.poked(("2-0", "2-1", {"x": "c"}))
    assert watch.take("1-0") == [("2-0", {"x": "b"}), ("2-1", {"x": "c"})]
    assert watch.take("2-1") == []  # nothing new


def test_a_watch_skips_what_a_read_gave_and_reads_across_a_gap() -> None:
    watch = Watch()
    assert watch.take("0-0") is None
    watch.poked(("1-0", "2-0", {"x": "b"}))  # read already by an overlapping read
    watch.poked(("2-0", "3-0", {"x": "c"}))
    assert watch.take("2-0") == [("3-0", {"x": "c"})]
    watch.poked(("4-0", "5-0", {"x": "e"}))  # 4-0's poke was lost
    assert watch.take("3-0") is None
    watch.poked(None)  # a poke that carries no entry
    assert watch.take("5-0") is None
    watch.lost()  # the subscription went down
    assert watch.take("5-0") is None


def test_a_watch_that_keeps_too_many_entries_reads_instead() -> None:
    watch = Watch()
    assert watch.take("0-0") is None
    for k in range(MAX_CARRIED + 1):
        watch.poked((f"{k}-0", f"{k + 1}-0", {}))
    assert watch.take("0-0") is None
    assert watch.event.is_set()


def test_a_poke_of_an_earlier_writer_carries_no_entry() -> None:
    assert carried_entry("tokens") is None
    assert carried_entry("[1") is None
    assert carried_entry('["0-0", "1-0", "k"]') is None  # a field without its value
    assert carried_entry('["0-0", "1-0", "k", "tokens"]') == ("0-0", "1-0", {"k": "tokens"})


async def _calls(client: aioredis.Redis, *commands: str) -> int:
    stats = await client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in commands)


async def _follow(reader: RedisQueue, rid: str, read: list[str]) -> None:
    async for event in reader.stream(rid, timeout_s=30.0):
        read.append(event.text if event.kind is StreamKind.TOKENS else str(event.kind))


async def _emit_tokens(writer: RedisQueue, rid: str, first: int, last: int) -> None:
    for k in range(first, last):
        await writer.emit(StreamEvent(rid, StreamKind.TOKENS, 1, 1.0 + k, f"t{k}", 1, k))
        await asyncio.sleep(0.02)


@dataclass
class Relay:
    """A writer and a reader (two queue objects, as an agent's and an API replica's) on one
    Redis, a request pulled by i0 whose stream the reader follows, and the stream reads Redis
    served since `mark`."""

    writer: RedisQueue
    reader: RedisQueue
    admin: aioredis.Redis
    read: list[str] = field(default_factory=list)
    reads_before: int = 0

    async def follow(self) -> asyncio.Task[None]:
        await self.writer.enqueue(make_request(id="r"))
        await self.writer.pull("i0", ["r"], lease_s=60.0, now_s=0.0)
        follower = asyncio.create_task(_follow(self.reader, "r", self.read))
        await asyncio.sleep(0.3)  # subscribed, first read done
        self.reads_before = await _calls(self.admin, "xread", "xrange")
        return follower

    async def reads(self) -> int:
        return await _calls(self.admin, "xread", "xrange") - self.reads_before


@pytest.fixture
async def relay(redis_url: str, redis_key_prefix: str) -> AsyncIterator[Relay]:
    writer = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix)
    reader = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix)
    admin = aioredis.Redis.from_url(redis_url)
    yield Relay(writer, reader, admin)
    await writer.close()
    await reader.close()
    await admin.aclose()


@pytest.mark.redis
async def test_a_follower_takes_each_entry_from_its_poke(relay: Relay) -> None:
    follower = await relay.follow()
    await _emit_tokens(relay.writer, "r", 0, TOKENS)
    while len(relay.read) < TOKENS:
        await asyncio.sleep(0.01)
    reads = await relay.reads()
    result = RequestResult("r", RequestState.COMPLETED, "i0", finished_at_s=9.0)
    await relay.writer.complete(result)
    await asyncio.wait_for(follower, 30.0)
    assert relay.read == [*(f"t{k}" for k in range(TOKENS)), "done"]
    # a read per poke would be TOKENS; one at most is a quiet spell's read on a slow machine
    assert reads <= 1


@pytest.mark.redis
async def test_a_lost_poke_costs_a_read_never_an_event(
    relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    wake = StreamPokes._wake
    pokes = 0

    def lossy(self: StreamPokes, channel: str, data: object) -> None:
        nonlocal pokes
        pokes += 1
        if pokes not in (3, 4):  # the third and fourth pokes never arrive
            wake(self, channel, data)

    monkeypatch.setattr(StreamPokes, "_wake", lossy)
    follower = await relay.follow()
    writer = relay.writer
    await _emit_tokens(writer, "r", 0, TOKENS)
    await writer.requeue("i0", ["r"], evicted=True, now_s=1.0)
    await writer.pull("i1", ["r"], lease_s=60.0, now_s=1.0)
    await writer.complete(RequestResult("r", RequestState.COMPLETED, "i1", finished_at_s=9.0))
    await asyncio.wait_for(follower, 30.0)
    assert relay.read == [*(f"t{k}" for k in range(TOKENS)), "requeued", "done"]
    assert await relay.reads() >= 1  # the fifth poke did not follow the second: a read
