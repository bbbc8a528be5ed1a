"""How calls share round trips to Redis: many EVALSHAs in one pipeline, and calls made in the
same event-loop iteration sent together (`TurnBatch`: commands and script calls by
`TurnPipeline`, stream reads by qlm/queue/redis/stream_reads.py). Each call still gets its
own result or error.

A pipeline of writes may end with WAIT (`ReplicaWait`): on the same connection, so it waits
for exactly those writes to reach the replicas; too few replicas in time fails every write of
the pipeline that asked for it with `ReplicasBehindError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import redis.asyncio as redis
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

ScriptCall = tuple[list[str], list[str | int]]  # (KEYS, ARGV)
T = TypeVar("T")
R = TypeVar("R")


class ReplicasBehindError(RedisConnectionError):
    """Fewer replicas than asked held a write within the timeout: the write may be lost with
    the primary, so it counts as failed (a connection error: the API answers 503)."""


@dataclass(frozen=True, slots=True)
class ReplicaWait:
    """After a pipeline of writes, WAIT until `replicas` replicas hold them, `timeout_s` at
    most (RedisQueueConfig.replicas_to_ack, replica_ack_timeout_s)."""

    replicas: int
    timeout_s: float

    def shortfall(self, acked: object) -> Exception | None:
        """What fails the pipeline's calls given WAIT's reply: its own error, or too few
        replicas; None when enough hold the writes."""
        if isinstance(acked, Exception):
            return acked
        if int(cast(int, acked)) < self.replicas:
            return ReplicasBehindError(
                f"{acked} of {self.replicas} replicas acknowledged the write in "
                f"{self.timeout_s:g} s"
            )
        return None


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
        return await self._add(item)

    async def call_all(self, items: Sequence[T]) -> list[R]:
        """Several calls, queued at once and in order (a gather of `call`s would queue them
        only when its tasks start, after calls made meanwhile); the first error is raised
        once every call has an outcome."""
        return list(await asyncio.gather(*[self._add(item) for item in items]))

    def _add(self, item: T) -> asyncio.Future[R]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, future))
        if len(self._pending) == 1:
            loop.call_soon(self._start_flush)
        return future

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


@dataclass(frozen=True, slots=True)
class Command:
    """One command of a turn's pipeline: execute_command's arguments; for an EVALSHA, the
    script it runs (loaded again should Redis have lost it); `acked`: a write that must reach
    the replicas (the pipeline then ends with WAIT, and a shortfall fails this command)."""

    args: tuple[Any, ...]
    script: AsyncScript | None = None
    acked: bool = False


class TurnPipeline:
    """Commands issued in the same event-loop iteration go to Redis in one pipeline: one
    write and one read for all of them instead of one round trip each, in the order they were
    issued. Under load the API parses several requests per iteration; an agent's round marks
    requests running, appends their tokens and records their results; the control loop reads
    the queue and the instances' reports together. On a small machine the system calls of a
    round trip (and the switch to the Redis server they cause) cost more than the command.
    Each command still gets its own result or error; scripts stay atomic one by one. Scripts
    go as plain EVALSHAs, not redis-py's Script in a pipeline, which asks SCRIPT EXISTS first
    (a second round trip per pipeline); those a server lost (restart, SCRIPT FLUSH, a replica
    just promoted) are loaded and sent again."""

    def __init__(self, client: redis.Redis, wait: ReplicaWait | None = None) -> None:
        self._client = client
        self._wait = wait
        self._batch: TurnBatch[Command, Any] = TurnBatch(self._send)

    async def script(
        self, script: AsyncScript, keys: Sequence[str], args: Sequence[str | int], acked: bool
    ) -> Any:
        command = Command(("EVALSHA", script.sha, len(keys), *keys, *args), script, acked)
        return await self._batch.call(command)

    async def scripts(
        self, script: AsyncScript, calls: Sequence[tuple[Sequence[str], Sequence[str | int]]]
    ) -> list[Any]:
        """Several calls of one script, all acknowledged writes, queued in order at once."""
        commands = [
            Command(("EVALSHA", script.sha, len(keys), *keys, *args), script, acked=True)
            for keys, args in calls
        ]
        return await self._batch.call_all(commands)

    async def command(self, *args: Any) -> Any:
        return await self._batch.call(Command(args))

    async def _send(self, commands: list[Command]) -> list[Any]:
        results = await self._execute(commands)
        lost = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if lost:  # a restarted or newly promoted server: load the scripts, send those again
            for script in {id(c.script): c.script for c in commands if c.script}.values():
                await self._client.script_load(script.script)
            again = await self._execute([commands[i] for i in lost])
            for i, result in zip(lost, again, strict=True):
                results[i] = result
        return results

    async def _execute(self, commands: Sequence[Command]) -> list[Any]:
        wait = self._wait if any(c.acked for c in commands) else None
        async with self._client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command.args)
            if wait is not None:
                pipe.execute_command("WAIT", wait.replicas, max(1, int(wait.timeout_s * 1000)))
            results: list[Any] = await pipe.execute(raise_on_error=False)
        if wait is not None:
            failed = wait.shortfall(results.pop())
            if failed is not None:
                results = [failed if c.acked else r for c, r in zip(commands, results, strict=True)]
        return results
