"""How plans are published to Redis and how readers learn of a new one.

`publish` stores a plan under the next epoch and appends the epoch to the `plan-changes`
stream. One watcher task per queue object blocks on that stream, so agents can wait for a
newer plan, any number of them, without a Redis connection each, and `current` skips reading
and parsing the plan's JSON while the watcher has seen no newer epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import KeyT, StreamIdT

from qlm.control.plan import PublishedPlan
from qlm.queue.redis.batching import TurnPipeline
from qlm.queue.redis.codec import as_strs, block_ms, xread_entries
from qlm.queue.redis.keys import Keys
from qlm.queue.redis.lua import scripts

log = logging.getLogger(__name__)


class PlanBoard:
    """The plan in Redis: publish it, read it, wait for a newer epoch."""

    def __init__(
        self,
        client: redis.Redis,
        blocking: redis.Redis,
        keys: Keys,
        block_chunk_s: float,
        turn: TurnPipeline,
    ) -> None:
        self._redis = client
        self._turn = turn  # the queue's: a publication shares the round trip of its turn
        self._blocking = blocking  # the watcher's blocking XREAD holds one of its connections
        self._keys = keys
        self._block_chunk_s = block_chunk_s
        self._publish = client.register_script(scripts.PUBLISH_PLAN)
        self._cache: PublishedPlan | None = None
        self._epoch = 0  # newest epoch the watcher saw (0: none yet)
        self._signal = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._heard_at_s = float("-inf")  # when the watcher's last read returned

    async def publish(self, plan: PublishedPlan) -> PublishedPlan:
        """Store the plan under the next epoch. This process's readers take it from here: an
        agent beside the control loop (`qlm serve`) neither reads nor parses the plan it just
        published once the watcher hears its epoch."""
        keys = [self._keys.epoch, self._keys.plan, self._keys.plan_changes]
        epoch = await self._turn.script(self._publish, keys, [plan.to_json()], acked=False)
        published = plan.with_epoch(int(epoch))
        if self._cache is None or published.epoch > self._cache.epoch:
            self._cache = published
        return published

    async def current(self) -> PublishedPlan | None:
        """The plan; its JSON is read and parsed only when the epoch changed (agents ask
        every round, the plan changes far less often)."""
        cached = self._cache
        watching = self._watching
        if cached is not None and watching and cached.epoch >= self._epoch:
            return cached  # the watcher saw no newer epoch (this process published it)
        if cached is not None and not (watching and self._epoch > cached.epoch):
            # Not known to be stale: the epoch alone first, the plan only if it moved on.
            # (When the watcher heard a newer epoch, the plan is read at once: an agent
            # asks after every publish, and the epoch's round trip would only confirm it.)
            epoch = await self._redis.hget(self._keys.plan, "epoch")
            if epoch is None:
                return None
            if cached.epoch == int(epoch):
                return cached
        epoch, text = as_strs(await self._redis.hmget(self._keys.plan, ["epoch", "json"]))
        if epoch is None or text is None:
            return None
        self._cache = PublishedPlan.from_json(text).with_epoch(int(epoch))
        return self._cache

    async def wait(self, newer_than_epoch: int, timeout_s: float) -> bool:
        """Served by one watcher task per queue that blocks on the plan-change stream, so
        any number of waiters (and their cancellation) cost no Redis connection."""
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch(), name="qlm-plan-watch")
        deadline_s = time.monotonic() + timeout_s
        while self._epoch <= max(newer_than_epoch, 0):  # 0: no plan seen yet
            self._signal.clear()
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left_s):
                    await self._signal.wait()
        return True

    @property
    def _watching(self) -> bool:
        """The watcher runs and heard from Redis within a blocking read's length (a
        half-open connection would otherwise freeze its epoch, and agents on the cache)."""
        fresh_s = self._block_chunk_s + 1.0
        return (
            self._watcher is not None
            and not self._watcher.done()
            and time.monotonic() - self._heard_at_s < fresh_s
        )

    async def _watch(self) -> None:
        last_id = "0-0"
        chunk_ms = block_ms(self._block_chunk_s)
        while True:
            try:
                streams: dict[KeyT, StreamIdT] = {self._keys.plan_changes: last_id}
                reply = xread_entries(await self._blocking.xread(streams, count=16, block=chunk_ms))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: readers ask Redis until it is back
                if not isinstance(exc, RedisConnectionError | RedisTimeoutError):
                    log.warning("plan watcher: %r; retrying", exc)
                self._epoch = 0
                await asyncio.sleep(0.1)
                continue
            self._heard_at_s = time.monotonic()
            for entry_id, fields in reply:
                last_id = entry_id
                self._epoch = max(self._epoch, int(fields["e"]))
            if reply:
                self._signal.set()

    async def close(self) -> None:
        """Stop the watcher, if one runs."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher
            self._watcher = None
