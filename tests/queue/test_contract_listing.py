"""The listing contract (`list_records`), on every implementation: newest first, by tenant
and state, in pages whose cursor stays valid while requests arrive; expired records vanish."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from qlm.queue.factory import make_queue
from qlm.queue.listing import RecordFilter
from qlm.queue.memory import MemoryQueue, MemoryQueueConfig
from qlm.types import RequestState
from tests.factories import make_request
from tests.queue.test_contract import QueueMaker, make, result

__all__ = ["make"]  # the fixture, parametrized over the implementations
S = RequestState


async def enqueue(queue: object, count: int, tenant: str) -> list[str]:
    ids = []
    for _ in range(count):
        request = replace(make_request(), tenant=tenant)
        await queue.enqueue(request)  # type: ignore[attr-defined]
        ids.append(request.id)
    return ids


async def all_pages(queue: object, page: RecordFilter) -> list[list[str]]:
    pages: list[list[str]] = []
    while True:
        got = await queue.list_records(page)  # type: ignore[attr-defined]
        pages.append([r.id for r in got.records])
        if got.next_before_seq is None:
            return pages
        page = replace(page, before_seq=got.next_before_seq)


async def test_pages_newest_first_by_tenant_and_state(make: QueueMaker) -> None:
    queue = await make()
    a_ids = await enqueue(queue, 3, "a")
    b_ids = await enqueue(queue, 2, "b")
    a_ids += await enqueue(queue, 2, "a")
    newest_a = a_ids[::-1]
    assert await all_pages(queue, RecordFilter("a", limit=3)) == [newest_a[:3], newest_a[3:]]
    assert await all_pages(queue, RecordFilter("b", limit=2)) == [b_ids[::-1]]  # exact: 1 page
    everyone = (await queue.list_records(RecordFilter(limit=100))).records
    assert [r.id for r in everyone] == [*a_ids[:3], *b_ids, *a_ids[3:]][::-1]
    # States: one pulled and completed, one cancelled.
    assert await queue.pull("i0", [a_ids[0]], 30.0, 1.0)
    assert await queue.complete(result(a_ids[0], "i0"))
    assert await queue.cancel(a_ids[1], 2.0)
    ended = RecordFilter("a", frozenset({S.COMPLETED, S.CANCELLED}))
    assert await all_pages(queue, ended) == [[a_ids[1], a_ids[0]]]
    assert [r.state for r in (await queue.list_records(ended)).records] == [
        S.CANCELLED,
        S.COMPLETED,
    ]
    queued = await all_pages(queue, RecordFilter("a", frozenset({S.QUEUED})))
    assert queued == [newest_a[:3]]


async def test_a_cursor_survives_new_arrivals(make: QueueMaker) -> None:
    queue = await make()
    ids = await enqueue(queue, 4, "a")
    first = await queue.list_records(RecordFilter("a", limit=2))
    assert [r.id for r in first.records] == ids[:1:-1]
    await enqueue(queue, 3, "a")  # newer than the whole listing: not on the next page
    rest = await queue.list_records(RecordFilter("a", before_seq=first.next_before_seq, limit=2))
    assert ([r.id for r in rest.records], rest.next_before_seq) == (ids[1::-1], None)


@pytest.mark.redis
async def test_expired_records_leave_the_redis_listing(
    redis_url: str, redis_key_prefix: str
) -> None:
    queue = make_queue(
        redis_url, key_prefix=redis_key_prefix, finished_ttl_s=0.2, max_listed_requests=3
    )
    ids = await enqueue(queue, 4, "a")  # the oldest falls out of the index at once
    assert await queue.cancel(ids[3], 1.0)
    assert [r.id for r in (await queue.list_records(RecordFilter("a"))).records] == ids[:0:-1]
    await asyncio.sleep(0.5)
    assert [r.id for r in (await queue.list_records(RecordFilter("a"))).records] == ids[2:0:-1]
    await queue.close()


async def test_dropped_finished_records_leave_the_memory_listing() -> None:
    queue = MemoryQueue(MemoryQueueConfig(max_finished_records=1))
    ids = await enqueue(queue, 3, "a")
    for rid in ids[:2]:
        assert await queue.cancel(rid, 1.0)
    assert [r.id for r in (await queue.list_records(RecordFilter())).records] == [ids[2], ids[1]]
