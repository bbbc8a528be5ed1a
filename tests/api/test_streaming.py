"""Streams end to end over a real server: an eviction in the middle does not repeat text, a
client that leaves cancels its request, and timeouts and failures end cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from qlm.api import create_app
from qlm.clock import VirtualClock
from qlm.queue.memory import MemoryQueue
from qlm.queue.records import RequestResult
from qlm.types import RequestState
from tests.api.conftest import make_settings, serving, wait_until
from tests.api.fake_agent import INSTANCE, FakeAgent

pytestmark = pytest.mark.timeout(60)
CHAT_BODY = {"model": "m7b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}


async def sse_data(resp: httpx.Response) -> AsyncIterator[Any]:
    """The `data:` payloads of an SSE response: parsed JSON, or the string [DONE]."""
    async for line in resp.aiter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            yield payload if payload == "[DONE]" else json.loads(payload)


async def test_requeue_mid_stream_does_not_duplicate_text(
    base_url: str, agent: FakeAgent, queue: MemoryQueue
) -> None:
    agent.evict_after_tokens = 3  # attempt 1 streams w0..w2, is evicted, attempt 2 starts over
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(stream=True, **CHAT_BODY)  # type: ignore[call-overload]
    pieces: list[str] = []
    rid = ""
    async for chunk in stream:
        rid = chunk.id
        pieces += [c.delta.content for c in chunk.choices if c.delta.content]
    await client.close()
    assert "".join(pieces) == "w0 w1 w2 w3 w4 w5 "
    assert len(pieces) == 6  # each token exactly once
    record = await queue.get(rid)
    assert record is not None
    assert (record.evictions, record.dispatches) == (1, 2)  # the eviction really happened


async def test_requeue_without_streaming_returns_final_text(
    base_url: str, agent: FakeAgent
) -> None:
    agent.evict_after_tokens = 2
    async with httpx.AsyncClient(base_url=base_url) as http:
        resp = await http.post("/v1/chat/completions", json=CHAT_BODY)
    assert resp.json()["choices"][0]["message"]["content"] == "w0 w1 w2 w3 w4 w5 "


async def test_sse_wire_format(base_url: str, agent: FakeAgent) -> None:
    body = {**CHAT_BODY, "stream": True, "max_tokens": 2}
    async with (
        httpx.AsyncClient(base_url=base_url) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.headers["content-type"].startswith("text/event-stream")
        rid = resp.headers["x-qlm-request-id"]
        raw = (await resp.aread()).decode()
    events = raw.split("\n\n")
    assert events[-1] == ""
    assert events[-2] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events[:-1])
    first = json.loads(events[0][len("data: ") :])
    assert first["id"] == rid
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


async def test_disconnect_cancels_streaming_request(
    base_url: str, agent: FakeAgent, queue: MemoryQueue
) -> None:
    agent.serving = False  # the request waits in the queue
    body = {**CHAT_BODY, "stream": True}
    async with (
        httpx.AsyncClient(base_url=base_url) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as resp,
    ):
        rid = resp.headers["x-qlm-request-id"]
        async for _ in sse_data(resp):
            break  # the role chunk arrived; now leave
    await wait_until(lambda: _state(queue, rid, RequestState.CANCELLED))


async def test_disconnect_cancels_waiting_request(
    base_url: str, agent: FakeAgent, queue: MemoryQueue
) -> None:
    agent.serving = False
    async with httpx.AsyncClient(base_url=base_url) as http:
        call = asyncio.create_task(
            http.post("/v1/completions", json={"model": "m7b", "prompt": "x"})
        )
        await wait_until(queue.queued)
        (request,) = await queue.queued()
        call.cancel()  # the client gives up and closes its connection
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await wait_until(lambda: _state(queue, request.id, RequestState.CANCELLED))


async def _state(queue: MemoryQueue, rid: str, state: RequestState) -> bool:
    record = await queue.get(rid)
    return record is not None and record.state is state


@pytest.fixture
async def slow_app_url(queue: MemoryQueue, clock: VirtualClock) -> AsyncIterator[str]:
    app = create_app(make_settings(completion_timeout_s=0.3), queue, clock)
    async with serving(app) as url:
        yield url


async def test_timeout_is_a_clean_error_and_request_stays(
    slow_app_url: str, queue: MemoryQueue
) -> None:
    async with httpx.AsyncClient(base_url=slow_app_url) as http:
        resp = await http.post("/v1/completions", json={"model": "m7b", "prompt": "x"})
        assert resp.status_code == 504
        error = resp.json()["error"]
        assert error["code"] == "completion_timeout"
        assert resp.headers["x-should-retry"] == "false"  # the OpenAI client must not resubmit
        rid = resp.headers["x-qlm-request-id"]
        assert rid in error["message"]
        state = (await http.get(f"/v1/qlm/requests/{rid}")).json()["state"]
    assert state == "queued"


async def test_streaming_timeout_ends_with_error_event(
    slow_app_url: str, queue: MemoryQueue
) -> None:
    body = {"model": "m7b", "prompt": "x", "stream": True}
    async with (
        httpx.AsyncClient(base_url=slow_app_url) as http,
        http.stream("POST", "/v1/completions", json=body) as resp,
    ):
        rid = resp.headers["x-qlm-request-id"]
        events = [e async for e in sse_data(resp)]
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "completion_timeout"
    assert await _state(queue, rid, RequestState.QUEUED)
    client = openai.AsyncOpenAI(base_url=f"{slow_app_url}/v1", api_key="unused", max_retries=0)
    stream = await client.completions.create(model="m7b", prompt="x", stream=True)
    with pytest.raises(openai.APIError, match="did not complete"):
        _ = [chunk async for chunk in stream]
    await client.close()


async def test_cancelled_while_waiting_is_409(base_url: str, queue: MemoryQueue) -> None:
    async with httpx.AsyncClient(base_url=base_url) as http:
        call = asyncio.create_task(
            http.post("/v1/completions", json={"model": "m7b", "prompt": "x"})
        )
        await wait_until(queue.queued)
        (request,) = await queue.queued()
        assert (await http.delete(f"/v1/qlm/requests/{request.id}")).status_code == 200
        resp = await call
    assert resp.status_code == 409
    assert resp.json()["error"]["code"] == "request_cancelled"


async def test_failed_request_reports_the_engine_error(
    base_url: str, queue: MemoryQueue, clock: VirtualClock
) -> None:
    async with httpx.AsyncClient(base_url=base_url) as http:
        body = {**CHAT_BODY, "stream": True}
        async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            rid = resp.headers["x-qlm-request-id"]
            await queue.pull(INSTANCE, [rid], 60.0, clock.now_s())
            failed = RequestResult(rid, RequestState.FAILED, INSTANCE, error="engine died")
            assert await queue.complete(failed)
            events = [e async for e in sse_data(resp)]
        assert events[-2]["error"]["code"] == "request_failed"
        assert "engine died" in events[-2]["error"]["message"]

        call = asyncio.create_task(
            http.post("/v1/completions", json={"model": "m7b", "prompt": "x"})
        )
        await wait_until(queue.queued)
        (request,) = await queue.queued()
        await queue.pull(INSTANCE, [request.id], 60.0, clock.now_s())
        await queue.complete(RequestResult(request.id, RequestState.FAILED, INSTANCE, error="oom"))
        resp = await call
    assert resp.status_code == 500
    assert resp.json()["error"]["code"] == "request_failed"
    assert resp.headers["x-should-retry"] == "false"
