"""The official openai client drives the API unchanged: chat and completions, plain and
streaming, sync and async clients, the model list, and errors as the client's exceptions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import openai
import pytest

from qlm.api.tokens import Utf8BytesCounter, flatten_chat
from qlm.queue.memory import MemoryQueue
from tests.api.conftest import NOW_S
from tests.api.fake_agent import FakeAgent

pytestmark = pytest.mark.timeout(60)
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name six words."},
]


@pytest.fixture
async def oai(base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    yield client
    await client.close()


def expected_prompt_tokens() -> int:
    return Utf8BytesCounter().count(flatten_chat((m["role"], m["content"]) for m in MESSAGES))


async def test_chat_completion(oai: openai.AsyncOpenAI, agent: FakeAgent) -> None:
    reply = await oai.chat.completions.create(model="m7b", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == "m7b"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "w0 w1 w2 w3 "
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == expected_prompt_tokens()
    assert reply.usage.completion_tokens == 4
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 4


async def test_completion(oai: openai.AsyncOpenAI, agent: FakeAgent) -> None:
    reply = await oai.completions.create(model="m13b", prompt="abcdefgh", max_tokens=50)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == "w0 w1 w2 w3 w4 w5 "
    assert reply.choices[0].finish_reason == "stop"  # shorter than max_tokens
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (2, 6)


async def test_streaming_chat_with_usage(oai: openai.AsyncOpenAI, agent: FakeAgent) -> None:
    stream = await oai.chat.completions.create(
        model="m7b",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    deltas, reasons, usage = [], [], None
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        for choice in chunk.choices:
            deltas.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
        usage = chunk.usage or usage
    assert "".join(deltas) == "w0 w1 w2 w3 w4 "
    assert len([d for d in deltas if d]) == 5  # one chunk per token event
    assert reasons[-1] == "length"
    assert set(reasons[:-1]) == {None}
    assert usage is not None
    assert usage.completion_tokens == 5
    assert usage.prompt_tokens == expected_prompt_tokens()


async def test_streaming_completion(oai: openai.AsyncOpenAI, agent: FakeAgent) -> None:
    stream = await oai.completions.create(model="m7b", prompt="hi", max_tokens=3, stream=True)
    texts, reasons = [], []
    async for chunk in stream:
        texts += [c.text for c in chunk.choices]
        reasons += [c.finish_reason for c in chunk.choices]
    assert "".join(texts) == "w0 w1 w2 "
    assert reasons[-1] == "length"


async def test_stream_falls_back_to_result_text(oai: openai.AsyncOpenAI, agent: FakeAgent) -> None:
    """An engine that reports its text only at the end still streams it."""
    agent.stream_text = False
    stream = await oai.completions.create(model="m7b", prompt="hi", max_tokens=2, stream=True)
    texts = [c.text async for chunk in stream for c in chunk.choices]
    assert "".join(texts) == "w0 w1 "


async def test_sync_client(base_url: str, agent: FakeAgent) -> None:
    def call() -> tuple[str | None, str]:
        with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as client:
            chat = client.chat.completions.create(model="m7b", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
            stream = client.completions.create(model="m7b", prompt="x", max_tokens=3, stream=True)
            text = "".join(c.text for chunk in stream for c in chunk.choices)
            return chat.choices[0].message.content, text

    content, streamed = await asyncio.to_thread(call)
    assert content == "w0 w1 "
    assert streamed == "w0 w1 w2 "


async def test_models_list_and_retrieve(oai: openai.AsyncOpenAI) -> None:
    models = await oai.models.list()
    assert [m.id for m in models.data] == ["m13b", "m7b"]
    assert {m.owned_by for m in models.data} == {"qlm"}
    assert {m.created for m in models.data} == {int(NOW_S)}
    model = await oai.models.retrieve("m13b")
    assert model.id == "m13b"
    with pytest.raises(openai.NotFoundError):
        await oai.models.retrieve("gpt-5")


async def test_slo_tags_through_the_client(
    oai: openai.AsyncOpenAI, agent: FakeAgent, queue: MemoryQueue
) -> None:
    reply = await oai.chat.completions.create(
        model="m7b",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=2,
        extra_body={"slo_class": "batch-1", "deadline_s": 30.0},
        extra_headers={"x-qlm-slo-class": "batch-2", "x-llm-d-slo-ttft-ms": "5000"},
    )
    record = await queue.get(reply.id)
    assert record is not None
    assert record.request.slo_class == "batch-1"  # the body beats the header
    assert record.request.ttft_deadline_at_s == NOW_S + 5.0  # llm-d target tightens 60 s
    assert record.request.completion_deadline_at_s == NOW_S + 30.0


async def test_request_id_header(oai: openai.AsyncOpenAI, agent: FakeAgent) -> None:
    raw = await oai.chat.completions.with_raw_response.create(
        model="m7b",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=1,
    )
    assert raw.headers["x-qlm-request-id"] == raw.parse().id


async def test_errors_become_client_exceptions(oai: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        await oai.chat.completions.create(model="nope", messages=MESSAGES)  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        await oai.chat.completions.create(
            model="m7b",
            messages=MESSAGES,  # type: ignore[arg-type]
            extra_body={"slo_class": "platinum"},
        )
    assert bad.value.param == "slo_class"
    assert bad.value.code == "unknown_slo_class"
