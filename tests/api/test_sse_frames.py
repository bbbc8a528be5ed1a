"""The SSE body's bytes: a text chunk built around a marker is the chunk built in full, and
what arrived together goes out in one write, the ending and [DONE] with the last text."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qlm.api.formats import CHAT, COMPLETION, Head, OutputFormat
from qlm.api.streaming import DONE_FRAME, ChunkFrames, SseResponse, StreamJob, frame, sse_frames
from qlm.queue.memory import MemoryQueue
from qlm.queue.records import RequestResult, StreamEvent, StreamKind
from qlm.types import RequestState
from tests.factories import make_request

HEAD = Head("chatcmpl-r0", 1_700_000_000, "m7b")


@pytest.mark.parametrize("fmt", [CHAT, COMPLETION], ids=["chat", "completion"])
@given(text=st.text())
def test_chunk_frame_is_the_chunk_built_in_full(fmt: OutputFormat, text: str) -> None:
    assert ChunkFrames(fmt, HEAD).text(text, None) == frame(fmt.chunk(HEAD, text, None))


@pytest.mark.parametrize("fmt", [CHAT, COMPLETION], ids=["chat", "completion"])
def test_chunks_with_extras_or_a_marked_model_are_built_in_full(fmt: OutputFormat) -> None:
    extras: dict[str, Any] = {"logprobs": {"tokens": ["a"], "token_logprobs": [-0.5]}}
    assert ChunkFrames(fmt, HEAD).text("a", extras) == frame(fmt.chunk(HEAD, "a", extras))
    marked = Head("id", 1, f"m{ChunkFrames.MARK}")  # the marker twice in the frame
    assert ChunkFrames(fmt, marked).text('"x"', None) == frame(fmt.chunk(marked, '"x"', None))


async def test_what_arrived_together_is_one_write_ending_with_done() -> None:
    queue = MemoryQueue()
    request = make_request(id="r0", model="m7b")
    await queue.enqueue(request)
    await queue.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    await queue.emit_many(
        [StreamEvent("r0", StreamKind.TOKENS, 1, 1.0, f"t{i} ", 1, i) for i in range(3)]
    )
    done = RequestResult(
        "r0", RequestState.COMPLETED, "i0", text="t0 t1 t2 ", output_tokens=3, finish_reason="stop"
    )
    assert await queue.complete(done)
    job = StreamJob(queue, CHAT, Head("r0", 1, "m7b"), 7, include_usage=True, timeout_s=5.0)
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        await asyncio.Event().wait()  # the client stays: the watcher is cancelled at the end

    async def nothing() -> None:
        return None

    await SseResponse(sse_frames(job), {}, nothing)({"type": "http"}, receive, send)
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert [m["more_body"] for m in bodies] == [True, False]  # the role chunk, then the rest
    payloads = [p for p in bodies[1]["body"].split(b"\n\n") if p]
    assert bodies[1]["body"].endswith(DONE_FRAME)
    chunks = [json.loads(p[len(b"data: ") :]) for p in payloads[:-1]]
    texts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert texts == ["t0 ", "t1 ", "t2 ", None]  # three texts, then the final chunk
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 3
