"""From a request's queue stream to the client: token de-duplication across attempts, waiting
for the final result, Server-Sent Events, and cancelling on client disconnect."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from qlm.api.errors import SERVER_ERROR, ApiError
from qlm.api.formats import Head, OutputFormat, usage
from qlm.queue.queue_protocol import GlobalQueue
from qlm.queue.records import RequestResult, StreamEvent, StreamKind
from qlm.types import RequestState

log = logging.getLogger(__name__)
NO_RETRY = {"x-should-retry": "false"}  # the OpenAI client would resubmit otherwise
DONE_FRAME = b"data: [DONE]\n\n"


class TokenForwarder:
    """The text of each TOKENS event that the client has not seen yet.

    When a request is evicted and runs again, its new attempt restarts at token 0. Tokens are
    placed by (attempt, offset_tokens): a chunk wholly below the tokens already forwarded is
    dropped, and a chunk that straddles that mark is cut by the characters already sent (the
    new attempt is assumed to repeat the old one's text, as greedy or seeded decoding does)."""

    def __init__(self) -> None:
        self._attempt = -1
        self._attempt_chars = 0
        self._sent_tokens = 0
        self._sent_chars = 0
        self.text_parts: list[str] = []
        # The extras (tool calls, log probabilities) of the last event fed, when it was new
        # as a whole; a chunk cut because an earlier attempt sent part of it has none.
        self.last_extras: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def feed(self, event: StreamEvent) -> str:
        self.last_extras = None
        if event.attempt < self._attempt:
            return ""  # a late chunk of an attempt already superseded
        if event.attempt > self._attempt:
            self._attempt, self._attempt_chars = event.attempt, 0
        start_chars = self._attempt_chars
        self._attempt_chars += len(event.text)
        end_tokens = event.offset_tokens + event.num_tokens
        if event.num_tokens and end_tokens <= self._sent_tokens:
            return ""
        if event.num_tokens and event.offset_tokens >= self._sent_tokens:
            new = event.text
        else:
            new = event.text[max(0, self._sent_chars - start_chars) :]
        self._sent_tokens = max(self._sent_tokens, end_tokens)
        self._sent_chars += len(new)
        if new:
            self.text_parts.append(new)
        if new == event.text:
            self.last_extras = event.extras
        return new

    def rest_of(self, result: RequestResult) -> str:
        """What the final result holds beyond the text forwarded (engines that report their
        text only at the end); empty when the result does not extend the forwarded text."""
        sent = self.text
        if len(result.text) > len(sent) and result.text.startswith(sent):
            rest = result.text[len(sent) :]
            self.text_parts.append(rest)
            return rest
        return ""


def is_completed(result: RequestResult | None) -> bool:
    return result is not None and result.state is RequestState.COMPLETED


def failure(result: RequestResult | None, request_id: str) -> ApiError:
    """The error a request that did not complete answers with."""
    if result is not None and result.state is RequestState.CANCELLED:
        return ApiError(
            409, f"Request {request_id} was cancelled.", code="request_cancelled", headers=NO_RETRY
        )
    reason = "" if result is None or not result.error else f": {result.error}"
    return ApiError(
        500,
        f"Request {request_id} failed{reason}.",
        code="request_failed",
        type=SERVER_ERROR,
        headers=NO_RETRY,
    )


def timeout_error(request_id: str, timeout_s: float) -> ApiError:
    return ApiError(
        504,
        f"Request {request_id} did not complete within {timeout_s:g} s; it stays queued: "
        f"GET /v1/qlm/requests/{request_id} for its state and result.",
        code="completion_timeout",
        type=SERVER_ERROR,
        headers=NO_RETRY,
    )


@dataclass(frozen=True, slots=True)
class Finished:
    result: RequestResult | None
    text: str


async def final_result(queue: GlobalQueue, request_id: str) -> Finished:
    """Follow the stream to its DONE event; the text is the result's, else the chunks'."""
    forwarder = TokenForwarder()
    async with contextlib.aclosing(_generator(queue.stream(request_id))) as events:
        async for event in events:
            if event.kind is StreamKind.TOKENS:
                forwarder.feed(event)
            elif event.kind is StreamKind.DONE:
                result = event.result
                text = result.text if result is not None and result.text else forwarder.text
                return Finished(result, text)
    return Finished(None, forwarder.text)


class ClientDisconnectedError(Exception):
    """The client went away before the answer was ready."""


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def race_disconnect(
    work: Awaitable[Finished], receive: Receive, timeout_s: float
) -> Finished:
    """`work`'s value; TimeoutError after timeout_s; ClientDisconnectedError if the client
    leaves first."""
    main = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(receive))
    try:
        done, _ = await asyncio.wait(
            (main, watch), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        watch.cancel()
        main.cancel()
    if main in done:
        return main.result()
    if watch in done:
        raise ClientDisconnectedError
    raise TimeoutError


def frame(data: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


@dataclass(frozen=True, slots=True)
class StreamJob:
    """One streaming request: where its events come from and how its chunks look."""

    queue: GlobalQueue
    fmt: OutputFormat
    head: Head
    prompt_tokens: int
    include_usage: bool
    timeout_s: float


class ChunkFrames:
    """The SSE frames of one stream's text chunks. A chunk's JSON differs from the stream's
    other chunks only in its text, so the frame is built once around a marker and each text
    is JSON-encoded into it (the same bytes as `frame(fmt.chunk(...))`, without building and
    encoding the envelope per token); chunks with extras are built in full."""

    MARK = "\ue000qlm-text\ue001"

    def __init__(self, fmt: OutputFormat, head: Head) -> None:
        self._fmt, self._head = fmt, head
        parts = frame(fmt.chunk(head, self.MARK, None)).split(json.dumps(self.MARK).encode())
        # A model name or id holding the marker would split in more places: build in full.
        self._around = (parts[0], parts[1]) if len(parts) == 2 else None

    def text(self, text: str, extras: dict[str, Any] | None) -> bytes:
        if extras or self._around is None:
            return frame(self._fmt.chunk(self._head, text, extras))
        before, after = self._around
        return before + json.dumps(text).encode() + after


async def sse_frames(job: StreamJob) -> AsyncGenerator[bytes, None]:
    """The SSE body: the format's first chunk, one chunk per new text, the final chunk
    (finish_reason), the usage chunk when asked, then [DONE]. The chunks of events that
    arrived together are yielded as one piece, and the last of them with the ending, so
    that each piece is one write to the client; the last piece ends with DONE_FRAME. A
    timeout or a failed or cancelled request ends the stream with an error event and
    [DONE]."""
    first = job.fmt.first_chunk(job.head)
    if first is not None:
        yield frame(first)
    follow, chunks = _Follow(job), ChunkFrames(job.fmt, job.head)
    last = b""
    try:
        async with contextlib.aclosing(follow.batches()) as batches:
            async for pieces in batches:
                body = b"".join(chunks.text(text, extras) for text, extras in pieces)
                if follow.done:
                    last = body  # written with the ending
                elif body:
                    yield body
    except TimeoutError:
        yield frame(timeout_error(job.head.id, job.timeout_s).body()) + DONE_FRAME
        return
    except Exception:
        log.exception("streaming request %s failed", job.head.id)
        yield frame(ApiError(500, "Internal server error.", type=SERVER_ERROR).body()) + DONE_FRAME
        return
    yield last + _ending(job, follow)


def _ending(job: StreamJob, follow: _Follow) -> bytes:
    """The frames after the last text: the rest of the result, the final and usage chunks
    and [DONE]; an error event and [DONE] for a request that did not complete."""
    result = follow.result
    if result is None or not is_completed(result):
        return frame(failure(result, job.head.id).body()) + DONE_FRAME
    frames = []
    rest = follow.forwarder.rest_of(result)
    if rest:
        frames.append(frame(job.fmt.chunk(job.head, rest, None)))
    frames.append(frame(job.fmt.final_chunk(job.head, result.finish_reason)))
    if job.include_usage:
        tokens = usage(result.prompt_tokens or job.prompt_tokens, result.output_tokens)
        frames.append(frame(job.fmt.usage_chunk(job.head, tokens)))
    frames.append(DONE_FRAME)
    return b"".join(frames)


Piece = tuple[str, dict[str, Any] | None]  # new text of a TOKENS event, and its extras


class _Follow:
    """Reads one request's stream: new text and extras per TOKENS event, then the DONE
    result."""

    def __init__(self, job: StreamJob) -> None:
        self._job = job
        self.forwarder = TokenForwarder()
        self.result: RequestResult | None = None
        self.done = False  # the DONE event was read

    async def batches(self) -> AsyncGenerator[list[Piece], None]:
        """The pieces of each batch of events read at once (the batch that holds DONE sets
        `done` and `result` first, and is the last). TimeoutError once the request's time
        is up; never yields inside the timeout scope."""
        deadline = asyncio.get_running_loop().time() + self._job.timeout_s
        events = self._job.queue.stream_batches(self._job.head.id)
        async with contextlib.aclosing(events):
            while True:
                async with asyncio.timeout_at(deadline):
                    batch = await anext(events, None)
                if batch is None:
                    return
                pieces = self._pieces(batch)
                if pieces or self.done:
                    yield pieces
                if self.done:
                    return

    def _pieces(self, batch: Sequence[StreamEvent]) -> list[Piece]:
        pieces: list[Piece] = []
        for event in batch:
            if event.kind is StreamKind.TOKENS:
                text = self.forwarder.feed(event)
                extras = self.forwarder.last_extras
                if text or extras:
                    pieces.append((text, extras))
            elif event.kind is StreamKind.DONE:
                self.result, self.done = event.result, True
                break  # queues end a batch at DONE; nothing after it counts regardless
        return pieces


async def _generator(events: AsyncIterator[StreamEvent]) -> AsyncGenerator[StreamEvent, None]:
    """Any async iterator as a generator that closes it when the reader stops early."""
    try:
        async for event in events:
            yield event
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()


class SseResponse(Response):
    """A streaming response that watches for the client leaving while it waits for events
    (not only when it writes) and then calls `on_disconnect` (shielded from cancellation)."""

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        headers: Mapping[str, str],
        on_disconnect: Callable[[], Awaitable[object]],
    ) -> None:
        self.status_code = 200
        self.background = None
        self._frames = frames
        self._on_disconnect = on_disconnect
        all_headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",
            **headers,
        }
        self.raw_headers = [(k.encode(), v.encode()) for k, v in all_headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        finished = False  # every frame was produced: the client leaving now changes nothing
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                await _disconnect(receive)
                group.cancel_scope.cancel()

            group.start_soon(watch)
            with contextlib.suppress(OSError):  # ASGI 2.4 servers raise on a closed connection
                async with contextlib.aclosing(self._frames) as frames:
                    async for chunk in frames:
                        finished = chunk.endswith(DONE_FRAME)  # the last piece: end with it
                        body = {"type": "http.response.body", "body": chunk}
                        await send({**body, "more_body": not finished})
                        if finished:
                            break
                if not finished:
                    finished = True
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
            group.cancel_scope.cancel()
        if not finished:
            with anyio.CancelScope(shield=True):
                try:
                    await self._on_disconnect()
                except Exception:
                    log.exception("cancelling a disconnected request failed")
