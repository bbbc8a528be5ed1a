"""Prefix-aware routing in the live plane (embedded queue, emulated engines with their prefix
cache): requests whose prompts share a long prefix land on the instance that holds it, even
when another instance is idle, and their prefill there hits the cache."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx
import pytest

from qlm.queue.records import RequestRecord
from qlm.serve.runtime import Plane, running_plane
from tests.serve.test_plane import PROFILE, config, wait_done

pytestmark = pytest.mark.timeout(120)

# 40 blocks of the API's 256 characters; at 2,000 prompt tokens/s its prefill takes ~1 s, so
# an idle instance waits that long (rent-or-buy) for the one holding it before taking a request
SHARED = "You are a careful assistant. Answer from the manual below only.\n" * 160
SLOW_PREFILL = {**PROFILE, "prefill_tokens_per_s": 2_000}


async def send(http: httpx.AsyncClient, prompt: str) -> str:
    body = {"kind": "completion", "model": "m-a", "prompt": prompt, "max_tokens": 4}
    response = await http.post("/v1/qlm/requests", json=body)
    assert response.status_code == 202, response.text
    rid: str = response.json()["id"]
    return rid


async def served(plane: Plane, ids: Sequence[str]) -> list[RequestRecord]:
    await wait_done(plane, ids)
    records = await asyncio.gather(*(plane.queue.get(i) for i in ids))
    assert all(r is not None and r.result is not None for r in records)
    return [r for r in records if r is not None]


async def test_a_shared_prefix_lands_where_it_is_cached() -> None:
    cfg = config([{"id": "i", "gpu_type": "A100", "model": "m-a", "count": 2}], SLOW_PREFILL)
    async with running_plane(cfg) as plane:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{plane.port}") as http:
            (first,) = await served(plane, [await send(http, SHARED + "Question 0?")])
            assert first.result is not None
            home = first.result.instance_id
            await asyncio.sleep(0.3)  # the home's agent reports what it holds
            followers = []
            for k in range(1, 5):
                followers += await served(plane, [await send(http, SHARED + f"Question {k}?")])
        assert [r.result.instance_id for r in followers if r.result] == [home] * 4
        agent = next(a for a in plane.agents if a.instance.id == home)
        status = agent.status(0.0)
        assert status.prefix_hit_tokens is not None
        assert status.prefix_prompt_tokens is not None
        # four prompts found the shared part cached: most of their prompt tokens
        assert status.prefix_hit_tokens > 0.6 * status.prefix_prompt_tokens
