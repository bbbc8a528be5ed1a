"""QLM's own engine end to end: the embedded plane (`running_plane`) with engine kind `native`
serving the tiny Llama (tokenizer included) of tests/vllm_fixtures.py, driven by the official
`openai` client: text comes back token by token, greedy answers repeat, a stop string cuts the
output, a seeded sample repeats, and a chat is flattened to text."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio
from tokenizers import Tokenizer

from qlm.config.serve_config import ServeConfig
from qlm.serve.runtime import running_plane
from tests.serve.test_vllm_plane import tiny_profile
from tests.vllm_fixtures import tiny_models, vllm_python  # noqa: F401

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]
PROMPT = "the queue model plans request group engine token batch"


def native_config(models: dict[str, Path]) -> ServeConfig:
    return ServeConfig.model_validate(
        {
            "api": {"port": 0},
            "engine": {
                "kind": "native",
                "native": {"models": {"tiny-a": str(models["tiny-a"])}, "max_num_seqs": 4},
            },
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
    async with running_plane(native_config(tiny_models)) as plane:
        base = f"http://127.0.0.1:{plane.port}/v1"
        oai = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
        yield oai
        await oai.close()


async def complete(client: openai.AsyncOpenAI, **fields: object) -> openai.types.Completion:
    body = {"model": "tiny-a", "prompt": PROMPT, "max_tokens": 24, "temperature": 0.0} | fields
    return await client.completions.create(**body)  # type: ignore[call-overload,no-any-return]


async def test_a_streamed_greedy_completion_is_the_same_text_as_a_whole_one(
    client: openai.AsyncOpenAI,
    tiny_models: dict[str, Path],  # noqa: F811
) -> None:
    whole = await complete(client, extra_body={"ignore_eos": True})
    text = whole.choices[0].text
    assert text
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 24
    tokenizer = Tokenizer.from_file(str(tiny_models["tiny-a"] / "tokenizer.json"))
    assert whole.usage.prompt_tokens == len(tokenizer.encode(PROMPT).ids)
    stream = await complete(client, stream=True, extra_body={"ignore_eos": True})
    pieces = [chunk.choices[0].text async for chunk in stream if chunk.choices]
    assert len([p for p in pieces if p]) > 1  # token by token, not one block
    assert "".join(pieces) == text


async def test_a_stop_string_cuts_the_output_before_it(client: openai.AsyncOpenAI) -> None:
    text = (await complete(client, extra_body={"ignore_eos": True})).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = (await complete(client, stop=[stop], extra_body={"ignore_eos": True})).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.find(stop)]
    stream = await complete(client, stop=[stop], stream=True, extra_body={"ignore_eos": True})
    pieces = [chunk.choices[0].text async for chunk in stream if chunk.choices]
    assert "".join(pieces) == cut.text  # nothing past the cut was streamed


async def test_a_seeded_sample_repeats_and_another_seed_differs(
    client: openai.AsyncOpenAI,
) -> None:
    async def sample(seed: int) -> str:
        answer = await complete(client, temperature=1.0, seed=seed, max_tokens=32)
        return answer.choices[0].text

    first = await sample(5)
    assert await sample(5) == first
    assert await sample(6) != first


async def test_a_chat_is_answered(client: openai.AsyncOpenAI) -> None:
    answer = await client.chat.completions.create(
        model="tiny-a",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=8,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    assert answer.choices[0].message.content
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 8


async def test_a_field_the_engine_does_not_honour_is_refused(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        await complete(client, logprobs=2)
