"""The program store in Redis, beside the queue (same server, same key prefix): programs as
JSON in one hash, the running ones in a set, cancel flags in a set, each program's contexts
in a hash of their own. Programs survive a restart
of every process (with the server's AOF on, as the chart runs it)."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import redis.asyncio as redis

from qlm.config.redis_config import RedisQueueConfig
from qlm.programs.program_contexts import ProgramContext
from qlm.programs.state import Program
from qlm.programs.storage import newest_first
from qlm.queue.redis.connect import store_client


class RedisProgramStore:
    def __init__(self, client: redis.Redis, key_prefix: str = "qlm:") -> None:
        self._r = client
        p = f"{key_prefix}program:"
        self._programs, self._running, self._cancels = p + "all", p + "running", p + "cancels"
        self._context_prefix = p + "contexts:"

    @classmethod
    def for_queue(cls, config: RedisQueueConfig) -> RedisProgramStore:
        """A store on the queue's server and key prefix, with a client of its own."""
        return cls(store_client(config, decode_responses=True), config.key_prefix)

    async def close(self) -> None:
        await self._r.aclose()

    async def put(self, program: Program) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(self._programs, program.id, json.dumps(program.to_dict()))
            if program.status.is_terminal:
                pipe.srem(self._running, program.id)
                pipe.srem(self._cancels, program.id)
            else:
                pipe.sadd(self._running, program.id)
            await pipe.execute()

    async def get(self, program_id: str) -> Program | None:
        raw = await self._r.hget(self._programs, program_id)
        return None if raw is None else Program.from_dict(json.loads(raw))

    async def of_tenant(self, tenant: str) -> list[Program]:
        raw: dict[Any, Any] = await self._r.hgetall(self._programs)
        programs = (Program.from_dict(json.loads(v)) for v in raw.values())
        return newest_first(p for p in programs if p.tenant == tenant)

    async def active(self) -> list[Program]:
        ids = sorted(await self._r.smembers(self._running))
        if not ids:
            return []
        raw = await self._r.hmget(self._programs, ids)
        return newest_first(Program.from_dict(json.loads(v)) for v in raw if v is not None)[::-1]

    async def request_cancel(self, program_id: str) -> None:
        await self._r.sadd(self._cancels, program_id)

    async def cancel_requested(self, program_id: str) -> bool:
        return bool(await self._r.sismember(self._cancels, program_id))

    async def put_context(self, program_id: str, context: ProgramContext) -> None:
        key = self._context_prefix + program_id
        await self._r.hset(key, context.name, json.dumps(context.to_dict()))

    async def contexts(self, program_id: str) -> dict[str, ProgramContext]:
        raw: dict[Any, Any] = await self._r.hgetall(self._context_prefix + program_id)
        return {name: ProgramContext.from_dict(json.loads(v)) for name, v in raw.items()}

    async def drop_contexts(self, program_id: str, names: Collection[str] | None = None) -> int:
        key = self._context_prefix + program_id
        if names is None:
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.hlen(key)
                pipe.delete(key)
                count, _ = await pipe.execute()
            return int(count)
        if not names:
            return 0
        dropped: int = await self._r.hdel(key, *names)
        return dropped
