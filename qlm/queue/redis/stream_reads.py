"""Reads of many request output streams, coalesced into one XREAD.

A process that relays many streams wakes many of their readers at once: an engine's token
step appends to every stream it serves, and each append pokes its readers
(qlm/queue/redis/pokes.py). When each reader sent its own XRANGE, a process paid one Redis
round trip per stream per step, and the packing, socket write and reply parse of each
command ran on its event loop: in a `qlm serve` on Redis relaying a burst of 256 streamed
requests (py-spy), socket writes of Redis commands were 37 % of the process's CPU. Readers
woken in the same turn of the event loop now leave their (stream, last entry) in a
`TurnBatch` (batching.py), and one XREAD, sent on the loop's next turn, reads for all of them.
"""

from __future__ import annotations

from typing import Any, cast

import redis.asyncio as redis

from qlm.queue.redis.batching import TurnBatch
from qlm.queue.redis.codec import Entries, as_range

START_ID = "0-0"  # XREAD's "after" for a stream read from its first entry


class CoalescedReads:
    """`after(key, last_id)`: the entries of one stream after `last_id`, read in a batch."""

    def __init__(self, client: redis.Redis, count: int) -> None:
        self._client = client
        self._count = count
        self._batch: TurnBatch[tuple[str, str], Entries] = TurnBatch(self._read)

    async def after(self, key: str, last_id: str) -> Entries:
        """At most `count` entries of stream `key` after entry `last_id` (START_ID: from its
        first entry)."""
        return await self._batch.call((key, last_id))

    async def _read(self, wanted: list[tuple[str, str]]) -> list[Entries]:
        """One XREAD for the batch's streams; a stream a second reader of this process asks
        for in the same batch (from its own entry) gets an XRANGE of its own."""
        first = dict(reversed(wanted))  # each stream's first reader in the batch
        reply = await self._client.xread(cast(Any, first), count=self._count)
        got = dict(cast(list[tuple[str, Entries]], reply or []))
        results: list[Entries] = []
        seen: set[str] = set()
        for key, last_id in wanted:
            if key in seen:
                own = await self._client.xrange(key, f"({last_id}", "+", count=self._count)
                results.append(as_range(own))
            else:
                seen.add(key)
                results.append(got.get(key, []))
        return results
