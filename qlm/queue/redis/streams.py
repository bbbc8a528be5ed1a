"""How a request's output events are written to its Redis Stream and read back.

Writes go through the EMIT script, one call per batch of events (an agent's round), which
appends each only while its request is live (so no token lands after DONE) and PUBLISHes a
poke carrying the entry. Readers read from the first entry, so a reader that connects late,
or on another API replica, sees the whole stream (readers woken together share one XREAD,
qlm/queue/redis/stream_reads.py); then they take each next entry from its poke
(qlm/queue/redis/pokes.py), read when a poke was lost or carried none, and re-read on a
timer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence

import redis.asyncio as redis

from qlm.queue.queue_protocol import QueueError, UnknownRequestError, through_done
from qlm.queue.records import StreamEvent, StreamKind
from qlm.queue.redis.batching import ScriptCall, TurnPipeline
from qlm.queue.redis.codec import event_args, event_from_fields
from qlm.queue.redis.keys import Keys
from qlm.queue.redis.lua import scripts
from qlm.queue.redis.pokes import StreamPokes
from qlm.queue.redis.stream_reads import START_ID, CoalescedReads

UNSUBSCRIBED_POLL_S = 0.05  # stream re-read period while the poke subscription is down
READ_COUNT = 256  # entries per read
EMIT_BATCH = 256  # events per EMIT call: a script runs alone on Redis, so a huge round is split


class OutputStreams:
    """Every request's output stream: emit events, read them in order until DONE."""

    def __init__(
        self,
        client: redis.Redis,
        blocking: redis.Redis,
        keys: Keys,
        block_chunk_s: float,
        turn: TurnPipeline,
    ) -> None:
        self._redis = client
        self._turn = turn  # the queue's: appends share its round trips (and its WAIT)
        self._keys = keys
        self._block_chunk_s = block_chunk_s
        self._emit = client.register_script(scripts.EMIT)
        self._pokes = StreamPokes(blocking, keys.stream_pattern)
        self._reads = CoalescedReads(client, READ_COUNT)

    async def emit(self, event: StreamEvent) -> None:
        await self.emit_many([event])

    async def emit_many(self, events: Sequence[StreamEvent]) -> None:
        """The events in one EMIT call per EMIT_BATCH (in order; each appended only while
        its request is live), the calls in one pipeline; with replicas to acknowledge, once
        they hold them."""
        if not events:
            return
        if any(event.kind is StreamKind.DONE for event in events):
            raise QueueError("DONE is emitted by complete() or cancel(), not by emit()")
        calls = [
            self._emit_call(events[i : i + EMIT_BATCH]) for i in range(0, len(events), EMIT_BATCH)
        ]
        # in the pipeline of the turn, in order with the rest of it (an agent round's marks
        # and results); the first error is raised once every call has run
        await self._turn.scripts(self._emit, calls)

    def _emit_call(self, events: Sequence[StreamEvent]) -> ScriptCall:
        keys: list[str] = []
        args: list[str | int] = []
        for event in events:
            keys += [self._keys.record(event.request_id), self._keys.stream(event.request_id)]
            args += event_args(event)
        return keys, args

    async def read(
        self, request_id: str, timeout_s: float | None = None
    ) -> AsyncGenerator[Sequence[StreamEvent], None]:
        """Each time the stream is poked, the entries the pokes carried when they follow the
        last one read (pokes.py, `Watch.take`), else a read from the last entry (reads woken
        together share one XREAD: stream_reads.py); a read also on a timer, should a poke be
        lost. Each wake's entries are one batch. Ends after DONE; UnknownRequestError once
        the record is gone, TimeoutError after `timeout_s` without an event. A read that got
        less than a full page waits for the next poke: the poke was cleared before the read,
        so whatever was added since pokes again (reading again at once cost an empty read per
        chunk)."""
        record_key, stream_key = self._keys.record(request_id), self._keys.stream(request_id)
        if not await self._redis.exists(record_key):
            raise UnknownRequestError(request_id)
        await self._pokes.start(timeout_s=1.0)
        last_id, waited_s, must_read = START_ID, 0.0, True
        with self._pokes.watch(stream_key) as watch:
            while True:
                watch.event.clear()
                entries = watch.take(last_id)  # what the pokes carried, when it follows
                if entries is None or must_read:
                    entries = await self._reads.after(stream_key, last_id)
                must_read = False
                if entries:
                    last_id = entries[-1][0]
                    events = [event_from_fields(request_id, fields) for _, fields in entries]
                    batch, done = through_done(events)
                    yield batch
                    if done:
                        return
                    waited_s = 0.0
                    if len(entries) >= READ_COUNT or not self._pokes.subscribed:
                        must_read = True
                        continue
                block_s = self._block_s(timeout_s, waited_s)
                if not self._pokes.subscribed:
                    block_s = min(block_s, UNSUBSCRIBED_POLL_S)
                if await _wait_event(watch.event, block_s):
                    continue
                must_read = True  # a quiet spell: read, should a poke have been lost
                waited_s += block_s
                if timeout_s is not None and waited_s >= timeout_s:
                    raise TimeoutError(f"no stream event for {request_id!r} within {timeout_s} s")
                if not await self._redis.exists(record_key):
                    raise UnknownRequestError(request_id)  # expired while we waited

    def _block_s(self, timeout_s: float | None, waited_s: float) -> float:
        chunk_s = self._block_chunk_s
        return chunk_s if timeout_s is None else min(chunk_s, max(timeout_s - waited_s, 0.0))

    async def close(self) -> None:
        """Stop listening for pokes."""
        await self._pokes.close()


async def _wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()
