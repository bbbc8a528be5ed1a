"""Build a GlobalQueue from a URL: `memory://` (or None) embeds one, `redis://`, `rediss://`
and `unix://` connect to Redis, `redis+sentinel://` to the primary its Sentinels name.
Schemes are registered by name; the Redis adapter is imported only when a Redis URL is asked
for, so the embedded default needs no redis library."""

from __future__ import annotations

from typing import Any

from qlm.queue.memory import MemoryQueue, MemoryQueueConfig
from qlm.queue.queue_protocol import GlobalQueue
from qlm.registry import Registry

QUEUE_SCHEMES: Registry[GlobalQueue] = Registry("queue URL scheme")


@QUEUE_SCHEMES.register("memory")
def _memory(url: str, **options: Any) -> GlobalQueue:
    clock = options.pop("clock", None)
    options.pop("key_prefix", None)  # one process's memory is its own namespace
    return MemoryQueue(MemoryQueueConfig(**options), clock=clock)


def _redis(url: str, **options: Any) -> GlobalQueue:
    from qlm.queue.redis import RedisQueue, RedisQueueConfig

    return RedisQueue(RedisQueueConfig(url=url, **options))


QUEUE_SCHEMES.register("redis")(_redis)
QUEUE_SCHEMES.register("rediss")(_redis)
QUEUE_SCHEMES.register("redis+sentinel")(_redis)
QUEUE_SCHEMES.register("unix")(_redis)


def make_queue(url: str | None = None, **options: Any) -> GlobalQueue:
    """A queue for `url`. Options go to the implementation's options: for memory
    `max_queued`, `max_finished_records`, `clock` (and `key_prefix`, ignored, so one call
    serves both); for Redis the fields of RedisQueueConfig
    other than url (`key_prefix`, `max_queued`, `finished_ttl_s`, ...)."""
    url = url or "memory://"
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(f"queue URL {url!r} has no scheme; known: {QUEUE_SCHEMES.names()}")
    return QUEUE_SCHEMES.create(scheme.lower(), url, **options)
