"""A fake agent for API tests: it pulls queued requests, streams a deterministic reply as
TOKENS events and completes them, like a real agent would through the queue. Switches make
it hold requests, evict once mid-stream, or report the text only in the result."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from qlm.clock import Clock
from qlm.queue.queue_protocol import GlobalQueue
from qlm.queue.records import RequestResult, StreamEvent, StreamKind
from qlm.types import Request, RequestState

INSTANCE = "fake-0"


def reply_tokens(request: Request, length: int) -> list[str]:
    """The reply the fake engine generates: `w0 w1 ...`, one word per token."""
    return [f"w{i} " for i in range(min(length, request.max_output_tokens))]


@dataclass
class FakeAgent:
    queue: GlobalQueue
    clock: Clock
    reply_length: int = 6
    serving: bool = True  # False: leave requests queued
    evict_after_tokens: int | None = None  # first attempt is evicted after this many tokens
    stream_text: bool = True  # False: only the final result carries the text
    served: int = 0

    async def run(self) -> None:
        while True:
            if self.serving:
                for request in await self.queue.queued():
                    await self.serve(request)
            await asyncio.sleep(0.002)

    async def serve(self, request: Request) -> None:
        now_s = self.clock.now_s()
        if not await self.queue.pull(INSTANCE, [request.id], 60.0, now_s):
            return
        record = await self.queue.get(request.id)
        assert record is not None
        attempt = record.dispatches
        await self.queue.mark_running(request.id, INSTANCE)
        tokens = reply_tokens(request, self.reply_length)
        for offset, token in enumerate(tokens):
            if attempt == 1 and offset == self.evict_after_tokens:
                await self.queue.requeue(INSTANCE, [request.id], True, now_s)
                return
            if self.stream_text:
                event = StreamEvent(request.id, StreamKind.TOKENS, attempt, now_s, token, 1, offset)
                await self.queue.emit(event)
            await asyncio.sleep(0)
        reason = "length" if len(tokens) == request.max_output_tokens else "stop"
        result = RequestResult(
            request.id,
            RequestState.COMPLETED,
            INSTANCE,
            text="".join(tokens),
            output_tokens=len(tokens),
            finish_reason=reason,
            dispatched_at_s=now_s,
            first_token_at_s=now_s,
            finished_at_s=now_s,
        )
        assert await self.queue.complete(result)
        self.served += 1
