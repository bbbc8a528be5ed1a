"""The live control plane end to end on the embedded queue with emulated engines: the official
openai client, the asynchronous API, evictions and model swaps carried out by the agents."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx
import openai
import pytest

from qlm.config.serve_config import ServeConfig
from qlm.serve.runtime import Plane, running_plane
from qlm.types import RequestState

pytestmark = pytest.mark.timeout(120)

PROFILE = {
    "gpu_type": "A100",
    "weight_bytes": 14 << 30,
    "kv_bytes_per_token": 128 * 1024,
    "decode_table": {"batch_sizes": [1, 2], "step_s": [0.02, 0.02]},
    "prefill_tokens_per_s": 100_000,
    "output_tokens_mean": 100,
    "output_tokens_std": 10,
    "load_s": 0.5,
    "max_batch_size": 2,
}


def config(
    instances: Sequence[dict[str, Any]],
    profile: dict[str, Any] = PROFILE,
    queue: dict[str, Any] | None = None,
    **agent: Any,
) -> ServeConfig:
    return ServeConfig.model_validate(
        {
            "queue": queue or {},
            "qlm": {
                "slo_classes": [
                    {"name": "interactive", "ttft_s": 1.0, "lateness_weight": 100, "priority": 2},
                    {"name": "batch-2", "ttft_s": 600.0, "lateness_weight": 1, "priority": 0},
                ],
                "planner": {"policy": "edf"},
                "control": {"tick_s": 0.05},
            },
            "api": {"port": 0},
            "agent": {"poll_s": 0.01, **agent},
            "engine": {"kind": "emulated", "speedup": 1.0, "output_length": "cap"},
            "models": [{"name": "m-a"}, {"name": "m-b"}],
            "fleet": {
                "packaged_profiles": False,
                "profiles": [{"model": m, **profile} for m in ("m-a", "m-b")],
                "instances": list(instances),
            },
        }
    )


async def submit(client: httpx.AsyncClient, n: int, model: str, max_tokens: int) -> list[str]:
    ids = []
    for i in range(n):
        body = {
            "kind": "completion",
            "model": model,
            "prompt": f"batch item {i}",
            "max_tokens": max_tokens,
            "slo_class": "batch-2",
        }
        response = await client.post("/v1/qlm/requests", json=body)
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    return ids


async def wait_done(plane: Plane, ids: Sequence[str], timeout_s: float = 60.0) -> None:
    async def all_done() -> None:
        while True:
            records = await asyncio.gather(*(plane.queue.get(i) for i in ids))
            if all(r is not None and r.state.is_terminal for r in records):
                return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(all_done(), timeout_s)


async def assert_completed_once(plane: Plane, ids: Sequence[str]) -> None:
    for record in await asyncio.gather(*(plane.queue.get(i) for i in ids)):
        assert record is not None
        assert record.state is RequestState.COMPLETED
        assert record.result is not None
        assert record.result.output_tokens >= 1


async def test_openai_client_and_async_api_complete_every_request() -> None:
    cfg = config([{"id": "i", "gpu_type": "A100", "model": "m-a", "count": 2}])
    async with running_plane(cfg) as plane:
        base = f"http://127.0.0.1:{plane.port}"
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused")
        chat = await client.chat.completions.create(
            model="m-a",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=5,
            extra_headers={"x-qlm-slo-class": "interactive"},
        )
        assert chat.choices[0].message.content
        assert chat.usage is not None
        assert chat.usage.completion_tokens == 5
        stream = await client.completions.create(
            model="m-a", prompt="hi", max_tokens=4, stream=True
        )
        text = "".join([c.choices[0].text async for c in stream if c.choices])
        assert text
        async with httpx.AsyncClient(base_url=base) as http:
            ids = await submit(http, 10, "m-a", 8)
            await wait_done(plane, ids)
            got = (await http.get(f"/v1/qlm/requests/{ids[0]}")).json()
        assert got["state"] == "completed"
        await assert_completed_once(plane, ids)


async def test_blocked_interactive_request_evicts_batch_work() -> None:
    cfg = config([{"id": "i", "gpu_type": "A100", "model": "m-a"}])
    async with running_plane(cfg) as plane:
        base = f"http://127.0.0.1:{plane.port}"
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            batch = await submit(http, 4, "m-a", 200)  # 4 s each at 20 ms per token
            await asyncio.sleep(0.5)  # both engine slots now run batch work
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused")
            start = asyncio.get_running_loop().time()
            await client.completions.create(model="m-a", prompt="now", max_tokens=2)
            waited_s = asyncio.get_running_loop().time() - start
            await wait_done(plane, batch)
        assert sum(a.counters.evictions for a in plane.agents) >= 1
        assert waited_s < 1.5  # without eviction it would wait ~3.5 s for a slot
        await assert_completed_once(plane, batch)
        records = await asyncio.gather(*(plane.queue.get(i) for i in batch))
        evicted = [r for r in records if r is not None and r.evictions >= 1]
        assert evicted
        for record in evicted:  # evicted while running: its first token is the first attempt's
            assert record.result is not None
            assert record.result.dispatched_at_s is not None
            first_s = record.result.first_token_at_s
            assert first_s is not None
            assert first_s < record.result.dispatched_at_s
            assert record.first_token_at_s == first_s


async def test_plan_asks_for_a_model_swap_and_the_agent_carries_it_out() -> None:
    cfg = config([{"id": "i", "gpu_type": "A100", "model": "m-a"}])
    async with running_plane(cfg) as plane:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{plane.port}") as http:
            ids = await submit(http, 3, "m-b", 5)
            await wait_done(plane, ids)
        await assert_completed_once(plane, ids)
        assert plane.agents[0].counters.swaps == 1
        assert plane.agents[0].engine.observe().model == "m-b"
