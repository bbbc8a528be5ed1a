"""Reads of many request output streams, coalesced into one XREAD.

A process that relays many streams wakes many of their readers at once: an engine's token
step appends to every stream it serves, and each append pokes its readers
(qlm/queue/redis/pokes.py). When each reader sent its own XRANGE, a process paid one Redis
round trip per stream per step, and the packing, socket write and reply parse of each
command ran on its event loop: in a `qlm serve` on Redis relaying a burst of 256 streamed
requests (py-spy), socket writes of Redis commands were 37 % of the process's CPU. Readers
woken in the same turn of the event loop now leave their (stream, last entry) here, and
one XREAD, sent on the loop's next turn, reads for all of them.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import redis.asyncio as redis

from qlm.queue.redis.codec import Entries, as_range

START_ID = "0-0"  # XREAD's "after" for a stream read from its first entry


class CoalescedReads:
    """`after(key, last_id)`: the entries of one stream after `last_id`, read in a batch."""

    def __init__(self, client: redis.Redis, count: int) -> None:
        self._client = client
        self._count = count
        self._batch: dict[str, tuple[str, asyncio.Future[Entries]]] = {}
        self._flush: asyncio.Task[None] | None = None  # will send the batch, not started yet
        self._sending: set[asyncio.Task[None]] = set()  # strong references while they run

    async def after(self, key: str, last_id: str) -> Entries:
        """At most `count` entries of stream `key` after entry `last_id` (START_ID: from its
        first), read by the next batch; a second reader of a stream already in the batch
        reads on its own."""
        if key in self._batch:
            reply = await self._client.xrange(key, f"({last_id}", "+", count=self._count)
            return as_range(reply)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Entries] = loop.create_future()
        self._batch[key] = (last_id, future)
        flush = self._flush
        if flush is None or flush.get_loop() is not loop:  # none waits to send this batch
            self._flush = loop.create_task(self._send(loop), name="qlm-stream-reads")
            self._sending.add(self._flush)
            self._flush.add_done_callback(self._sending.discard)
        return await future

    async def _send(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take the batch (readers from now on start the next one) and read it."""
        batch = {k: v for k, v in self._batch.items() if v[1].get_loop() is loop}
        self._batch, self._flush = {}, None
        if not batch:
            return
        try:
            streams = {key: last_id for key, (last_id, _) in batch.items()}
            reply = await self._client.xread(cast(Any, streams), count=self._count)
        except asyncio.CancelledError:  # shutting down: so are its readers
            for _, future in batch.values():
                future.cancel()
            raise
        except Exception as exc:  # the readers raise what the batch met
            for _, future in batch.values():
                if not future.done():
                    future.set_exception(exc)
            return
        got = dict(cast(list[tuple[str, Entries]], reply or []))
        for key, (_, future) in batch.items():
            if not future.done():  # a reader that was cancelled is skipped
                future.set_result(got.get(key, []))
