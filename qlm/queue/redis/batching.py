"""How script calls share round trips to Redis: many EVALSHAs in one pipeline, and calls made
in the same event-loop iteration committed together. Each call still gets its own result or
error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio as redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

ScriptCall = tuple[list[str], list[str | int]]  # (KEYS, ARGV)


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


class GroupCommit:
    """Script calls made in the same event-loop iteration go to Redis in one pipeline: one
    write and one read for all of them instead of one round trip each. Under load the API
    parses several requests per iteration, and on a small machine the system calls of a
    round trip cost more than the script. Each call still gets its own result or error."""

    def __init__(self, client: redis.Redis, script: AsyncScript) -> None:
        self._client = client
        self._script = script
        self._pending: list[tuple[list[str], list[str | int], asyncio.Future[Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def call(self, keys: list[str], args: list[str | int]) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((keys, args, future))
        if len(self._pending) == 1:
            loop.call_soon(self._start_flush)
        return await future

    def _start_flush(self) -> None:
        task = asyncio.get_running_loop().create_task(self._flush(self._pending))
        self._pending = []
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(
        self, batch: list[tuple[list[str], list[str | int], asyncio.Future[Any]]]
    ) -> None:
        try:
            if len(batch) == 1:
                keys, args, _ = batch[0]
                results: list[Any] = [await self._script(keys, args)]
            else:
                calls = [(keys, args) for keys, args, _ in batch]
                results = await pipelined(self._client, self._script, calls)
        except Exception as exc:  # the connection failed: every call in the batch fails
            results = [exc] * len(batch)
        for (_, _, future), result in zip(batch, results, strict=True):
            if future.done():
                continue  # the caller was cancelled
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)
