"""Listing a caller's requests from Redis: the `listed` indexes (id -> arrival sequence,
every request's and each tenant's, written by ENQUEUE) read newest first in batches, their
records fetched in one pipeline per batch. An index entry whose record expired
(`finished_ttl_s`) is removed when a listing meets it."""

from __future__ import annotations

from typing import cast

import redis.asyncio as redis

from qlm.queue.listing import RecordFilter, RecordPage, take_page
from qlm.queue.records import RequestRecord
from qlm.queue.redis.codec import as_hash, record_from_fields
from qlm.queue.redis.keys import Keys

_BATCH = 200  # index entries read per round trip


async def list_page(client: redis.Redis, keys: Keys, page: RecordFilter) -> RecordPage:
    index = keys.listed(page.tenant)
    upper = "+inf" if page.before_seq is None else f"({page.before_seq}"
    found: list[tuple[int, RequestRecord]] = []
    while len(found) <= page.limit:
        reply = await client.zrevrangebyscore(
            index, upper, "-inf", start=0, num=max(_BATCH, page.limit + 1), withscores=True
        )
        rows = [(str(rid), int(seq)) for rid, seq in cast(list[tuple[str, float]], reply)]
        if not rows:
            break
        found += await _kept(client, keys, index, rows, page)
        upper = f"({rows[-1][1]}"
    return take_page(found, page)


async def _kept(
    client: redis.Redis,
    keys: Keys,
    index: str,
    rows: list[tuple[str, int]],
    page: RecordFilter,
) -> list[tuple[int, RequestRecord]]:
    async with client.pipeline(transaction=False) as pipe:
        for rid, _ in rows:
            pipe.hgetall(keys.record(rid))
        replies = await pipe.execute()
    kept: list[tuple[int, RequestRecord]] = []
    gone: list[str] = []
    for (rid, seq), fields in zip(rows, replies, strict=True):
        if not fields:
            gone.append(rid)
            continue
        record = record_from_fields(as_hash(fields))
        if page.keeps(record):
            kept.append((seq, record))
    if gone:
        await client.zrem(index, *gone)
    return kept
