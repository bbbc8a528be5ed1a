"""The batch store in Redis, beside the queue (same server, same key prefix): jobs as JSON in
one hash, files' metadata in another and their bytes under a key each, the jobs not yet
terminal in a set, cancel flags in a set. Everything survives a restart of every process
(with the server's AOF on, as the chart runs it)."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as redis

from qlm.batch.jobs import BatchJob, StoredFile
from qlm.config.redis_config import RedisQueueConfig
from qlm.queue.redis.connect import store_client


class RedisBatchStore:
    """`client` must not decode responses (file contents are bytes)."""

    def __init__(self, client: redis.Redis, key_prefix: str = "qlm:") -> None:
        self._r = client
        p = f"{key_prefix}batch:"
        self._jobs, self._active, self._cancels = p + "jobs", p + "active", p + "cancels"
        self._files, self._content = p + "files", p + "file:"

    @classmethod
    def for_queue(cls, config: RedisQueueConfig) -> RedisBatchStore:
        """A store on the queue's server and key prefix, with a client of its own."""
        return cls(store_client(config, decode_responses=False), config.key_prefix)

    async def close(self) -> None:
        await self._r.aclose()

    async def put_file(self, meta: StoredFile, content: bytes) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.set(self._content + meta.id, content)
            pipe.hset(self._files, meta.id, json.dumps(meta.to_dict()))
            await pipe.execute()

    async def file(self, file_id: str) -> StoredFile | None:
        raw = await self._r.hget(self._files, file_id)
        return None if raw is None else StoredFile.from_dict(json.loads(raw))

    async def content(self, file_id: str) -> bytes | None:
        raw: Any = await self._r.get(self._content + file_id)
        return None if raw is None else bytes(raw)

    async def files(self, tenant: str, purpose: str | None = None) -> list[StoredFile]:
        raw: dict[Any, Any] = await self._r.hgetall(self._files)
        metas = [StoredFile.from_dict(json.loads(v)) for v in raw.values()]
        mine = [m for m in metas if m.tenant == tenant and purpose in (None, m.purpose)]
        return sorted(mine, key=lambda m: (m.created_at, m.id), reverse=True)

    async def delete_file(self, file_id: str) -> bool:
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hdel(self._files, file_id)
            pipe.delete(self._content + file_id)
            removed, _ = await pipe.execute()
        return bool(removed)

    async def put_batch(self, job: BatchJob) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(self._jobs, job.id, json.dumps(job.to_dict()))
            if job.status.is_terminal:
                pipe.srem(self._active, job.id)
            else:
                pipe.sadd(self._active, job.id)
            await pipe.execute()

    async def batch(self, batch_id: str) -> BatchJob | None:
        raw = await self._r.hget(self._jobs, batch_id)
        return None if raw is None else BatchJob.from_dict(json.loads(raw))

    async def batches(self, tenant: str) -> list[BatchJob]:
        raw: dict[Any, Any] = await self._r.hgetall(self._jobs)
        jobs = [BatchJob.from_dict(json.loads(v)) for v in raw.values()]
        mine = [j for j in jobs if j.tenant == tenant]
        return sorted(mine, key=lambda j: (j.created_at, j.id), reverse=True)

    async def active(self) -> list[BatchJob]:
        ids = sorted(await self._r.smembers(self._active))
        if not ids:
            return []
        raw = await self._r.hmget(self._jobs, ids)
        jobs = [BatchJob.from_dict(json.loads(v)) for v in raw if v is not None]
        return sorted(jobs, key=lambda j: (j.created_at, j.id))

    async def request_cancel(self, batch_id: str) -> None:
        await self._r.sadd(self._cancels, batch_id)

    async def cancel_requested(self, batch_id: str) -> bool:
        return bool(await self._r.sismember(self._cancels, batch_id))
