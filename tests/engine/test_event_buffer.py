"""EventBuffer: the agent sleeps on it and wakes as soon as an engine task leaves an event."""

from __future__ import annotations

import asyncio
import time

from qlm.engine.client import EventBuffer
from qlm.engine.engine_types import FirstToken, RequestFinished, TokenChunk


async def test_wait_wakes_when_an_event_arrives() -> None:
    buffer = EventBuffer()

    async def produce() -> None:
        await asyncio.sleep(0.05)
        buffer.append(FirstToken("r0", 1.0))

    started = time.monotonic()
    task = asyncio.create_task(produce())
    assert await buffer.wait(timeout_s=10.0)
    assert time.monotonic() - started < 5.0
    await task
    assert buffer.drain() == [FirstToken("r0", 1.0)]
    assert len(buffer) == 0


async def test_wait_times_out_without_events_and_drain_rearms() -> None:
    buffer = EventBuffer()
    assert not await buffer.wait(timeout_s=0.02)
    buffer.append(FirstToken("r0", 1.0))
    assert await buffer.wait(timeout_s=0.0)  # pending events: at once
    buffer.drain()
    assert not await buffer.wait(timeout_s=0.02)


async def test_token_chunks_wait_to_go_out_together() -> None:
    """Chunks alone wake the agent once the oldest is `tokens_after_s` old, carrying the
    chunks that came meanwhile; with no hold (0) the first chunk wakes it at once."""
    buffer = EventBuffer()
    loop = asyncio.get_running_loop()

    async def produce(count: int, gap_s: float) -> None:
        for i in range(count):
            buffer.append(TokenChunk("r0", float(i), "x", 1))
            await asyncio.sleep(gap_s)

    task = asyncio.create_task(produce(20, 0.005))
    started = loop.time()
    assert await buffer.wait(timeout_s=10.0, tokens_after_s=0.06)
    held_s = loop.time() - started
    events = buffer.drain()
    await task
    assert held_s >= 0.06
    assert len(events) >= 3  # several engine steps' chunks in one round, not one each
    assert all(isinstance(e, TokenChunk) for e in events)

    buffer.append(TokenChunk("r0", 30.0, "x", 1))
    started = loop.time()
    assert await buffer.wait(timeout_s=10.0, tokens_after_s=0.0)
    assert loop.time() - started < 0.05


async def test_any_other_event_sends_the_held_chunks_at_once() -> None:
    """A first token, a finish or an abort is never held, and takes the chunks with it."""
    buffer = EventBuffer()
    loop = asyncio.get_running_loop()
    buffer.append(TokenChunk("r0", 1.0, "a", 1))

    async def finish() -> None:
        await asyncio.sleep(0.02)
        buffer.append(RequestFinished("r0", 2.0, 1.0, 2, "stop"))

    task = asyncio.create_task(finish())
    started = loop.time()
    assert await buffer.wait(timeout_s=10.0, tokens_after_s=5.0)
    assert loop.time() - started < 2.0  # the finish woke it, not the 5 s hold
    await task
    kinds = [type(e) for e in buffer.drain()]
    assert kinds == [TokenChunk, RequestFinished]


async def test_held_chunks_are_due_at_the_timeout() -> None:
    """The agent's poll period bounds the hold: chunks pending at the timeout count as due."""
    buffer = EventBuffer()
    loop = asyncio.get_running_loop()
    buffer.append(TokenChunk("r0", 1.0, "a", 1))
    started = loop.time()
    assert await buffer.wait(timeout_s=0.03, tokens_after_s=5.0)
    assert 0.02 <= loop.time() - started < 2.0
    buffer.drain()
    assert not await buffer.wait(timeout_s=0.01, tokens_after_s=5.0)
