"""asyncio helpers the live processes share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any


async def first_done(waits: Sequence[Awaitable[Any]], timeout_s: float) -> None:
    """Wait until the first of `waits` is done, or `timeout_s`; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
