"""The error matrix: every bad request gets OpenAI's error format with the right status and
`param`, and none of them disturbs requests already accepted."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest

from qlm.queue.memory import MemoryQueue
from qlm.types import RequestState
from tests.api.conftest import wait_until
from tests.api.fake_agent import FakeAgent

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SUBMIT = "/v1/qlm/requests"
USER = [{"role": "user", "content": "hi"}]
CALL = {"id": "call-1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m7b", "messages": USER, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m7b", "prompt": "hi", **fields}


# (path, body: dict -> JSON, bytes -> as is, headers) -> (status, param, code)
CASES: list[Any] = [
    pytest.param(CHAT, b'{"model": ', {}, 400, None, "invalid_json", id="malformed-json"),
    pytest.param(CHAT, b"", {}, 400, None, "invalid_json", id="empty-body"),
    pytest.param(CHAT, b"[1, 2]", {}, 400, None, "invalid_body", id="not-an-object"),
    pytest.param(
        COMPLETIONS,
        b'{"model": "m7b", "prompt": "\xff\xfe"}',
        {},
        400,
        None,
        "invalid_utf8",
        id="invalid-utf8",
    ),
    pytest.param(CHAT, chat(max_tokens="5"), {}, 400, "max_tokens", None, id="max-tokens-str"),
    pytest.param(CHAT, chat(max_tokens=2.5), {}, 400, "max_tokens", None, id="max-tokens-float"),
    pytest.param(CHAT, chat(max_tokens=0), {}, 400, "max_tokens", None, id="max-tokens-zero"),
    pytest.param(
        COMPLETIONS, completion(max_tokens=-3), {}, 400, "max_tokens", None, id="max-tokens-neg"
    ),
    pytest.param(
        CHAT,
        chat(max_completion_tokens=0),
        {},
        400,
        "max_completion_tokens",
        None,
        id="max-completion-tokens-zero",
    ),
    pytest.param(CHAT, {"model": "m7b"}, {}, 400, "messages", None, id="no-messages"),
    pytest.param(CHAT, chat(messages=[]), {}, 400, "messages", None, id="empty-messages"),
    pytest.param(
        CHAT,
        chat(messages=[{"role": "robot", "content": "x"}]),
        {},
        400,
        "messages[0].role",
        None,
        id="bad-role",
    ),
    pytest.param(
        CHAT,
        chat(messages=[{"role": "user", "content": 5}]),
        {},
        400,
        "messages[0].content",
        None,
        id="content-type",
    ),
    pytest.param(
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        {},
        400,
        "messages[0].content[0].type",
        None,
        id="image-part",
    ),
    pytest.param(CHAT, {"messages": USER}, {}, 400, "model", None, id="no-model"),
    pytest.param(CHAT, chat(model=7), {}, 400, "model", None, id="model-type"),
    pytest.param(
        CHAT, chat(model="gpt-9"), {}, 404, "model", "model_not_found", id="unknown-model"
    ),
    pytest.param(COMPLETIONS, {"model": "m7b"}, {}, 400, "prompt", None, id="no-prompt"),
    pytest.param(
        COMPLETIONS, completion(prompt=["a", "b"]), {}, 400, "prompt", None, id="two-prompts"
    ),
    pytest.param(
        COMPLETIONS, completion(prompt=[1, 2, 3]), {}, 400, "prompt", None, id="token-prompt"
    ),
    pytest.param(
        CHAT,
        chat(slo_class="gold"),
        {},
        400,
        "slo_class",
        "unknown_slo_class",
        id="unknown-class",
    ),
    pytest.param(CHAT, chat(slo_class=""), {}, 400, "slo_class", None, id="empty-class"),
    pytest.param(
        CHAT,
        chat(),
        {"x-qlm-slo-class": "gold"},
        400,
        "x-qlm-slo-class",
        "unknown_slo_class",
        id="unknown-class-header",
    ),
    pytest.param(CHAT, chat(slo_ttft_s=-1), {}, 400, "slo_ttft_s", None, id="negative-ttft"),
    pytest.param(
        CHAT,
        chat(slo_ttft_s=1e9),
        {},
        400,
        "slo_ttft_s",
        "invalid_slo_target",
        id="absurd-ttft",
    ),
    pytest.param(CHAT, chat(deadline_s=0), {}, 400, "deadline_s", None, id="zero-deadline"),
    pytest.param(
        CHAT,
        chat(deadline_s=1e12),
        {},
        400,
        "deadline_s",
        "invalid_slo_target",
        id="absurd-deadline",
    ),
    pytest.param(
        CHAT,
        chat(),
        {"x-qlm-slo-ttft-ms": "abc"},
        400,
        "x-qlm-slo-ttft-ms",
        None,
        id="ttft-header-text",
    ),
    pytest.param(
        CHAT,
        chat(),
        {"x-llm-d-slo-ttft-ms": "-5"},
        400,
        "x-llm-d-slo-ttft-ms",
        "invalid_slo_target",
        id="llmd-header-negative",
    ),
    pytest.param(
        COMPLETIONS,
        completion(model="m13b", prompt="x" * (4 * 2048)),
        {},
        400,
        "prompt",
        "context_length_exceeded",
        id="prompt-over-context",
    ),
    pytest.param(
        CHAT,
        chat(model="m13b", messages=[{"role": "user", "content": "y" * (4 * 2100)}]),
        {},
        400,
        "messages",
        "context_length_exceeded",
        id="messages-over-context",
    ),
    pytest.param(
        CHAT,
        chat(max_tokens=5000),
        {},
        400,
        "max_tokens",
        "context_length_exceeded",
        id="max-tokens-over-context",
    ),
    pytest.param(
        CHAT,
        chat(model="m13b", max_tokens=513),
        {},
        400,
        "max_tokens",
        "context_length_exceeded",
        id="max-tokens-over-model-cap",
    ),
    pytest.param(CHAT, chat(n=2), {}, 400, "n", None, id="n-two"),
    pytest.param(CHAT, chat(temperature=5), {}, 400, "temperature", None, id="temperature"),
    pytest.param(CHAT, chat(stream="yes"), {}, 400, "stream", None, id="stream-type"),
    pytest.param(
        COMPLETIONS,
        b'{"model": "m7b", "prompt": "x", "slo_ttft_s": NaN}',
        {},
        400,
        "slo_ttft_s",
        None,
        id="nan",
    ),
    pytest.param(
        CHAT,
        chat(messages=[{"role": "user", "content": "z" * 70_000}]),
        {},
        413,
        None,
        "request_too_large",
        id="too-large",
    ),
    pytest.param(SUBMIT, chat(), {}, 400, "kind", None, id="submit-no-kind"),
    pytest.param(SUBMIT, chat(kind="embedding"), {}, 400, "kind", None, id="submit-bad-kind"),
    pytest.param(
        SUBMIT, chat(kind="chat", messages=[]), {}, 400, "messages", None, id="submit-chat-field"
    ),
    pytest.param(
        SUBMIT,
        completion(kind="completion", max_tokens=0),
        {},
        400,
        "max_tokens",
        None,
        id="submit-completion-field",
    ),
    pytest.param(
        SUBMIT, chat(kind="chat", stream=True), {}, 400, "stream", None, id="submit-stream"
    ),
    pytest.param(
        SUBMIT,
        chat(kind="chat", slo_class="gold"),
        {},
        400,
        "slo_class",
        "unknown_slo_class",
        id="submit-unknown-class",
    ),
    # OpenAI fields QLM's engines do not honour: refused, never accepted and ignored
    *[
        pytest.param(path, body, {}, 400, param, "unsupported_parameter", id=f"unsupported-{param}")
        for path, body, param in [
            (CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
            (CHAT, chat(tool_choice="required"), "tool_choice"),
            (CHAT, chat(response_format={"type": "json_object"}), "response_format"),
            (CHAT, chat(logprobs=True, top_logprobs=2), "logprobs"),
            (CHAT, chat(presence_penalty=0.5), "presence_penalty"),
            (CHAT, chat(frequency_penalty=0.5), "frequency_penalty"),
            (CHAT, chat(logit_bias={"50256": -100}), "logit_bias"),
            (COMPLETIONS, completion(echo=True), "echo"),
            (COMPLETIONS, completion(best_of=2), "best_of"),
            (COMPLETIONS, completion(suffix="!"), "suffix"),
            (SUBMIT, {"kind": "chat", **chat(tools=[CALL])}, "tools"),
            (
                CHAT,
                chat(messages=[{"role": "assistant", "content": None, "tool_calls": [CALL]}]),
                "messages[0].tool_calls",
            ),
        ]
    ],
]


async def send(
    client: httpx.AsyncClient, path: str, body: dict[str, Any] | bytes, headers: dict[str, str]
) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **headers}
    return await client.post(path, content=content, headers=headers)


def assert_openai_error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    assert error["message"]
    return dict(error)


@pytest.mark.parametrize(("path", "body", "headers", "status", "param", "code"), CASES)
async def test_error_matrix(
    client: httpx.AsyncClient,
    queue: MemoryQueue,
    path: str,
    body: dict[str, Any] | bytes,
    headers: dict[str, str],
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    error = assert_openai_error(await send(client, path, body, headers), status)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    if code is not None:
        assert error["code"] == code
    assert sum((await queue.counts()).values()) == 0  # nothing was enqueued


async def test_declared_length_over_limit_is_refused_before_reading(
    client: httpx.AsyncClient,
) -> None:
    resp = await client.post(
        CHAT, content=b"{}", headers={"content-length": "999999999", "content-type": "x"}
    )
    assert assert_openai_error(resp, 413)["code"] == "request_too_large"


async def test_chunked_body_over_limit(client: httpx.AsyncClient) -> None:
    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(100):
            yield b" " * 1024

    resp = await client.post(CHAT, content=chunks())
    assert_openai_error(resp, 413)


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/nothing", 404, "not_found"),
        ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
        ("GET", "/v1/qlm/requests/unknown", 404, "request_not_found"),
        ("DELETE", "/v1/qlm/requests/unknown", 404, "request_not_found"),
        ("GET", "/v1/models/unknown", 404, "model_not_found"),
    ],
)
async def test_routing_errors_use_the_same_format(
    client: httpx.AsyncClient, method: str, path: str, status: int, code: str
) -> None:
    error = assert_openai_error(await client.request(method, path), status)
    assert error["code"] == code


async def test_bad_requests_do_not_disturb_accepted_ones(
    client: httpx.AsyncClient, queue: MemoryQueue, agent: FakeAgent
) -> None:
    """Requests accepted before and after the whole error matrix are all still there, with
    their views unchanged by it, and all served."""
    agent.serving = False

    async def accept(n: int, word: str) -> list[str]:
        ids = []
        for i in range(n):
            body = {"kind": "completion", "model": "m7b", "prompt": f"{word} {i}"}
            resp = await client.post(SUBMIT, json=body)
            assert resp.status_code == 202
            ids.append(resp.json()["id"])
        return ids

    ids = await accept(3, "before")
    views = [(await client.get(f"{SUBMIT}/{i}")).json() for i in ids]
    for case in CASES:
        path, body, headers, status, *_ = case.values
        assert (await send(client, path, body, headers)).status_code == status
    assert [(await client.get(f"{SUBMIT}/{i}")).json() for i in ids] == views
    ids += await accept(3, "after")
    assert (await queue.counts())[RequestState.QUEUED] == 6
    agent.serving = True

    async def all_done() -> bool:
        states = [(await client.get(f"{SUBMIT}/{i}")).json()["state"] for i in ids]
        return states == ["completed"] * 6

    await wait_until(all_done)
    assert agent.served == 6


async def test_unknown_fields_that_ask_for_nothing_are_dropped(
    client: httpx.AsyncClient, agent: FakeAgent
) -> None:
    """What clients and replayed histories send with default values passes; a tool message
    with its call id passes (its content is the prompt text)."""
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "refusal": None, "tool_calls": []},
        {"role": "tool", "content": "42", "tool_call_id": "call-1"},
    ]
    body = chat(messages=history, logprobs=None, echo=False, presence_penalty=0, tools=[])
    resp = await client.post(CHAT, json={**body, "max_tokens": 2})
    assert resp.status_code == 200, resp.text


async def test_a_client_that_leaves_mid_body_is_answered_without_an_application_error(
    base_url: str, queue: MemoryQueue, caplog: pytest.LogCaptureFixture
) -> None:
    """Fewer body bytes than Content-Length, then the connection closes: no ASGI exception
    is logged, nothing is queued, and the server goes on serving."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    writer.write((head + "content-length: 1000\r\n\r\n").encode() + b'{"model": "m7b"')
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    del reader
    async with httpx.AsyncClient(base_url=base_url) as http:
        ok = await http.post(SUBMIT, json={"kind": "completion", "model": "m7b", "prompt": "x"})
    assert ok.status_code == 202
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert (await queue.counts())[RequestState.QUEUED] == 1
