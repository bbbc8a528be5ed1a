"""How calls share round trips to Redis: many EVALSHAs in one pipeline, and calls made in the
same event-loop iteration sent together (`TurnBatch`: script calls by `GroupCommit`, stream
reads by qlm/queue/redis/stream_reads.py). Each call still gets its own result or error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import redis.asyncio as redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

ScriptCall = tuple[list[str], list[str | int]]  # (KEYS, ARGV)
T = TypeVar("T")
R = TypeVar("R")


async def pipelined(
    client: redis.Redis, script: AsyncScript, calls: Sequence[ScriptCall]
) -> list[Any]:
    """Each call's result (or error) from one pipeline of EVALSHAs. Not redis-py's Script
    in a pipeline, which asks SCRIPT EXISTS first (a second round trip per pipeline); a
    server that lost the script (restart, SCRIPT FLUSH) gets it loaded by the calls that
    then run again, in order."""
    async with client.pipeline(transaction=False) as pipe:
        for keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        results: list[Any] = await pipe.execute(raise_on_error=False)
    if any(isinstance(r, NoScriptError) for r in results):
        results = []
        for keys, args in calls:  # Script.__call__ loads the script on NOSCRIPT
            try:
                results.append(await script(keys, args))
            except Exception as exc:
                results.append(exc)
    return results


class TurnBatch(Generic[T, R]):
    """Calls made in the same event-loop iteration, sent together: `send` gets the items of
    every call of the iteration, in order, and answers one result (or exception) each. A
    call made while a batch is out starts the next one. An exception `send` raises fails
    every call of its batch; a cancelled caller is skipped."""

    def __init__(self, send: Callable[[list[T]], Awaitable[Sequence[R | Exception]]]) -> None:
        self._send = send
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def call(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, future))
        if len(self._pending) == 1:
            loop.call_soon(self._start_flush)
        return await future

    def _start_flush(self) -> None:
        task = asyncio.get_running_loop().create_task(self._flush(self._pending))
        self._pending = []
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        results: Sequence[R | Exception]
        try:
            results = await self._send([item for item, _ in batch])
        except Exception as exc:  # the connection failed: every call in the batch fails
            results = [exc] * len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue  # the caller was cancelled
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)


class GroupCommit:
    """Script calls made in the same event-loop iteration go to Redis in one pipeline: one
    write and one read for all of them instead of one round trip each. Under load the API
    parses several requests per iteration, and on a small machine the system calls of a
    round trip cost more than the script. Each call still gets its own result or error."""

    def __init__(self, client: redis.Redis, script: AsyncScript) -> None:
        self._client = client
        self._script = script
        self._batch: TurnBatch[ScriptCall, Any] = TurnBatch(self._send)

    async def call(self, keys: list[str], args: list[str | int]) -> Any:
        return await self._batch.call((keys, args))

    async def _send(self, calls: list[ScriptCall]) -> list[Any]:
        if len(calls) == 1:
            keys, args = calls[0]
            return [await self._script(keys, args)]
        return await pipelined(self._client, self._script, calls)
