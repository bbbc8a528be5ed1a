"""EventBuffer: the agent sleeps on it and wakes as soon as an engine task leaves an event."""

from __future__ import annotations

import asyncio
import time

from qlm.engine.client import EventBuffer
from qlm.engine.engine_types import FirstToken


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
