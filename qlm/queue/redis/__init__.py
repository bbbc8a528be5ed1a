"""The Redis adapter of the global queue: RedisQueue and its configuration.

    redis_config.py    how to reach Redis (URL, credentials, TLS, pools, retries)
    queue.py     RedisQueue: what each GlobalQueue operation does in Redis
    keys.py      where each thing is kept (key names under one prefix)
    codec.py     how records, events and numbers are written to Redis and read back
    batching.py  how script calls share round trips (pipelines, group commit)
    plans.py     how plans are published and watched
    streams.py   how output events are written and read
    pokes.py     how stream readers are woken (one pub/sub subscription per process)
    lua/         the Lua script behind each state change

This is the only package that imports the redis library; qlm.queue.factory imports it only
for a Redis URL.
"""

from qlm.config.redis_config import RedisQueueConfig
from qlm.queue.redis.queue import RedisQueue

__all__ = ["RedisQueue", "RedisQueueConfig"]
