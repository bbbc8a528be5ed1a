"""Wake-ups for readers of request output streams, one Redis connection per process.

Every append to a request's stream is also PUBLISHed on a channel named like the stream key
(qlm/queue/redis/lua/scripts.py). A process holds one pattern subscription (`{prefix}s:*`) and wakes
the local readers of that stream, who then read the new entries (non-blocking; readers woken
together share one XREAD, stream_reads.py).
Before, every open stream held a blocking XREAD connection of its own: thousands of
connections for thousands of streaming clients, each opened on the first token.

Each poke carries the entry it announces (qlm/queue/redis/lua/scripts.py, `append`): the
stream's previous entry id, the new entry's id and its fields. A reader whose last entry is
the carried one's previous takes the entry from the poke and sends no read (`Watch.take`): a
streamed request used to cost one XREAD per token chunk on top of the poke.

Pub/sub is at-most-once: a poke published while the subscription reconnects is lost. So every
reader is woken after each (re)subscription and re-reads from its last entry, a carried entry
that does not follow the reader's last one (a poke was lost) makes it read too, and readers
also re-read on their own after a quiet spell (the caller's timeout), so a lost poke costs
latency, never data.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator

import redis.asyncio as redis

from qlm.queue.redis.codec import Entries

log = logging.getLogger(__name__)

MAX_CARRIED = 256  # entries a watch keeps for its reader; past that it reads the stream again
Carried = tuple[str, str, dict[str, str]]  # (previous entry id, entry id, fields)


def carried_entry(data: object) -> Carried | None:
    """The entry a poke carries, or None for a poke that carries none (a writer of an earlier
    version, or a message that does not parse)."""
    if not isinstance(data, str) or not data.startswith("["):
        return None
    try:
        flat = json.loads(data)
    except ValueError:
        return None
    if not isinstance(flat, list) or len(flat) < 2 or len(flat) % 2:
        return None
    fields = flat[2:]
    return str(flat[0]), str(flat[1]), dict(zip(fields[::2], fields[1::2], strict=True))


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id ('ms-seq') as a number pair that orders like the stream."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class Watch:
    """One reader's view of its stream's pokes: `event` is set on each, `take` gives the
    entries they carried that follow the reader's last entry."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self._carried: list[Carried] = []
        self._stale = True  # read the stream first: entries appended before the watch began

    def poked(self, carried: Carried | None) -> None:
        if carried is None or len(self._carried) >= MAX_CARRIED:
            self._stale = True  # a poke without its entry, or too many kept: read
            self._carried.clear()
        else:
            self._carried.append(carried)
        self.event.set()

    def lost(self) -> None:
        """Pokes may have been lost (the subscription went down): read before trusting any."""
        self._stale = True
        self._carried.clear()
        self.event.set()

    def take(self, last_id: str) -> Entries | None:
        """The carried entries after `last_id`, in order, when they follow it without a gap
        (an empty list: nothing new); None when the reader must read the stream (pokes lost,
        a poke without its entry, or a carried entry that does not follow `last_id`)."""
        carried, self._carried = self._carried, []
        if self._stale:
            self._stale = False
            return None
        entries: Entries = []
        for prev, entry_id, fields in carried:
            if entry_key(entry_id) <= entry_key(last_id):
                continue  # read already (a read overlapped its poke)
            if prev != last_id:
                return None  # a gap: an entry between was not carried to us
            entries.append((entry_id, fields))
            last_id = entry_id
        return entries


class StreamPokes:
    """One listener task per queue object; `watch(channel)` gives a Watch poked on each
    message of that channel."""

    def __init__(self, client: redis.Redis, pattern: str, retry_s: float = 0.1) -> None:
        self._client = client
        self._pattern = pattern
        self._retry_s = retry_s
        self._waiters: dict[str, set[Watch]] = {}
        self._subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float) -> bool:
        """Start listening (idempotent); True once subscribed, False if that took longer
        than `timeout_s` (readers then fall back to re-reading on their timeout)."""
        if self._task is None or self._task.done():
            self._subscribed.clear()
            self._task = asyncio.create_task(self._listen(), name="qlm-stream-pokes")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._subscribed.wait()
        return self._subscribed.is_set()

    @property
    def subscribed(self) -> bool:
        return self._subscribed.is_set()

    @contextlib.contextmanager
    def watch(self, channel: str) -> Iterator[Watch]:
        watch = Watch()
        waiters = self._waiters.setdefault(channel, set())
        waiters.add(watch)
        try:
            yield watch
        finally:
            waiters.discard(watch)
            if not waiters:
                self._waiters.pop(channel, None)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _listen(self) -> None:
        while True:
            # Subscribe confirmations are kept: redis-py reconnects and re-subscribes on its
            # own, and each confirmation is the moment to wake every reader, whose pokes may
            # have been lost while the connection was down.
            pubsub = self._client.pubsub(ignore_subscribe_messages=False)
            try:
                await pubsub.psubscribe(self._pattern)
                async for message in pubsub.listen():
                    kind = message.get("type")
                    if kind == "pmessage":
                        self._wake(str(message["channel"]), message.get("data"))
                    elif kind == "psubscribe":
                        self._subscribed.set()
                        self._wake_all()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: resubscribe rather than go quiet
                log.warning("stream pokes: subscription lost (%r); resubscribing", exc)
                await asyncio.sleep(self._retry_s)
            finally:
                self._subscribed.clear()
                self._wake_all()
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _wake(self, channel: str, data: object) -> None:
        waiters = self._waiters.get(channel)
        if not waiters:
            return  # nobody reads this stream in this process: the message is not parsed
        carried = carried_entry(data)
        for watch in waiters:
            watch.poked(carried)

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for watch in waiters:
                watch.lost()
