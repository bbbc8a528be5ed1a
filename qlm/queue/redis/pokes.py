"""Wake-ups for readers of request output streams, one Redis connection per process.

Every append to a request's stream is also PUBLISHed on a channel named like the stream key
(qlm/queue/redis/lua/scripts.py). A process holds one pattern subscription (`{prefix}s:*`) and wakes
the local readers of that stream, who then read the new entries (non-blocking; readers woken
together share one XREAD, stream_reads.py).
Before, every open stream held a blocking XREAD connection of its own: thousands of
connections for thousands of streaming clients, each opened on the first token.

Pub/sub is at-most-once: a poke published while the subscription reconnects is lost. So every
reader is woken after each (re)subscription and re-reads from its last entry, and readers also
re-read on their own after a quiet spell (the caller's timeout), so a lost poke costs latency,
never data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import redis.asyncio as redis

log = logging.getLogger(__name__)


class StreamPokes:
    """One listener task per queue object; `watch(channel)` gives an Event set on each poke."""

    def __init__(self, client: redis.Redis, pattern: str, retry_s: float = 0.1) -> None:
        self._client = client
        self._pattern = pattern
        self._retry_s = retry_s
        self._waiters: dict[str, set[asyncio.Event]] = {}
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
    def watch(self, channel: str) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        waiters = self._waiters.setdefault(channel, set())
        waiters.add(event)
        try:
            yield event
        finally:
            waiters.discard(event)
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
                        self._wake(str(message["channel"]))
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

    def _wake(self, channel: str) -> None:
        for event in self._waiters.get(channel, ()):
            event.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()
