"""End to end with real parts: the control plane on a real redis-server with two vLLM-CPU
instances serving tiny local Llamas, driven through the official openai client.

Interactive requests arrive while a batch backlog fills both engines: the plan puts them at the
head of a virtual queue and the agents evict batch work for them; a few requests for a second
model make the plan swap one instance's model. Every accepted request must complete exactly
once, and batch work must still finish."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from qlm.config.serve_config import ServeConfig
from qlm.queue.records import RequestRecord
from qlm.serve.runtime import Plane, running_plane
from qlm.types import RequestState
from tests.vllm_fixtures import tiny_engine_config, tiny_models, vllm_python  # noqa: F401

pytestmark = [pytest.mark.vllm, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(900)]

INTERACTIVE_TTFT_S = 8.0  # generous: CI machines are shared; eviction is asserted separately


def tiny_profile(model: str) -> dict[str, Any]:
    """Rough CPU figures for the tiny models (measured order of magnitude on this machine)."""
    return {
        "model": model,
        "gpu_type": "cpu",
        "weight_bytes": 10737418,  # 0.01 GiB
        "kv_bytes_per_token": 1024,
        "decode_table": {"batch_sizes": [1, 4], "step_s": [0.008, 0.012]},
        "prefill_tokens_per_s": 20_000,
        "output_tokens_mean": 200,
        "output_tokens_std": 100,
        "load_s": 40,
        "max_batch_size": 4,
    }


def slow_profile(model: str) -> dict[str, Any]:
    """`tiny_profile` with decode steps slower than vLLM-CPU's real ones: an agent frees room
    by eviction only when, by its profile, the running requests would not end before an
    interactive deadline. With the real speed, a request 830 tokens into its 1,500 looked due
    in time and nothing was evicted (a CI run where the interactive chat came late); at 50 ms
    a step, that takes 1,340 tokens, which the backlog is far from when the chats come."""
    return tiny_profile(model) | {"decode_table": {"batch_sizes": [1, 4], "step_s": [0.04, 0.05]}}


def plane_config(
    models: dict[str, Path],
    redis_url: str,
    profile: Callable[[str], dict[str, Any]] = slow_profile,
) -> ServeConfig:
    # Two engines on a CPU machine: vLLM's automatic thread binding puts both on core 0 (the
    # fidelity benchmark measured it), so one engine's decode stalls the other's prefill.
    unbound = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    engine = tiny_engine_config(models, max_num_seqs=4, max_model_len=2048, env=unbound)
    return ServeConfig.model_validate(
        {
            "qlm": {
                "slo_classes": [
                    {
                        "name": "interactive",
                        "ttft_s": INTERACTIVE_TTFT_S,
                        "priority": 2,
                        "lateness_weight": 100,
                    },
                    {"name": "batch-2", "ttft_s": 1200.0, "priority": 0, "lateness_weight": 1},
                ],
                "planner": {"policy": "milp", "time_limit_s": 0.3},
                # groups sized to these 4-slot engines (the defaults suit GPU batch sizes):
                # a 16-request backlog becomes several groups the plan spreads over both
                "grouping": {"policy": "kmeans", "avg_batch_size": 4, "delta": 2},
                "control": {"tick_s": 0.1},
            },
            "queue": {"url": redis_url, "key_prefix": "e2e:"},
            "api": {"port": 0},
            "agent": {"poll_s": 0.02},
            "engine": {"kind": "vllm", "vllm": engine.model_dump(mode="json")},
            "models": [
                {"name": "tiny-a", "max_context_tokens": 2048},
                {"name": "tiny-b", "max_context_tokens": 2048},
            ],
            "fleet": {
                "gpu_types": {"cpu": {"memory_gib": 1.0}},
                "packaged_profiles": False,
                "profiles": [profile("tiny-a"), profile("tiny-b")],
                "instances": [{"id": "cpu", "gpu_type": "cpu", "model": "tiny-a", "count": 2}],
            },
        }
    )


async def submit_batch(http: httpx.AsyncClient, model: str, n: int, max_tokens: int) -> list[str]:
    ids = []
    for i in range(n):
        body = {
            "kind": "completion",
            "model": model,
            "prompt": f"batch document {i} " * 8,
            "max_tokens": max_tokens,
            "slo_class": "batch-2",
        }
        response = await http.post("/v1/qlm/requests", json=body)
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    return ids


async def interactive(client: openai.AsyncOpenAI) -> tuple[float, str, int, str]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    first = None
    text = []
    request_id = ""
    stream = await client.chat.completions.create(
        model="tiny-a",
        messages=[{"role": "user", "content": "a quick question"}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-qlm-slo-class": "interactive"},
        # Exactly max_tokens on any engine: a tiny random model may sample its end-of-sequence
        # token early (the native engine honours it; CI saw 14 of 16 once).
        extra_body={"ignore_eos": True},
    )
    usage = 0
    async for chunk in stream:
        request_id = chunk.id
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else loop.time() - start
            text.append(chunk.choices[0].delta.content)
    assert first is not None
    return first, "".join(text), usage, request_id


def hops(record: RequestRecord) -> str:
    """Where an interactive request's time went, for a failure message: queue wait (arrival
    to dispatch), engine TTFT (dispatch to first token), attempts and evictions."""
    result = record.result
    if result is None or result.dispatched_at_s is None or result.first_token_at_s is None:
        return f"{record.id}: {record.request.state.value}, no timings"
    queued_s = result.dispatched_at_s - record.request.arrival_at_s
    engine_s = result.first_token_at_s - result.dispatched_at_s
    return (
        f"{record.id} on {result.instance_id}: queued {queued_s:.2f} s, engine TTFT "
        f"{engine_s:.2f} s, attempt {result.attempt}, {record.evictions} evictions"
    )


async def records(plane: Plane, ids: list[str]) -> list[RequestRecord]:
    got = await asyncio.gather(*(plane.queue.get(i) for i in ids))
    assert all(r is not None for r in got)
    return [r for r in got if r is not None]


async def running(plane: Plane, ids: list[str], count: int, timeout_s: float) -> None:
    """Wait until `count` of the requests produce tokens at once, or `timeout_s` (the
    assertions on what followed decide then: one CI run never saw all 8 at once)."""

    async def started() -> None:
        while sum(r.state is RequestState.RUNNING for r in await records(plane, ids)) < count:
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(started(), timeout_s)
    except TimeoutError:  # shown if the assertions that follow fail
        states = [(r.state.value, r.instance_id, r.result) for r in await records(plane, ids)]
        print(f"not {count} running after {timeout_s} s: {states}")


async def wait_terminal(plane: Plane, ids: list[str], timeout_s: float) -> None:
    async def done() -> None:
        while not all(r.state.is_terminal for r in await records(plane, ids)):
            await asyncio.sleep(0.2)

    await asyncio.wait_for(done(), timeout_s)


async def backlog_chats_and_swap(
    plane: Plane, backlog_n: int, chats_n: int, timeout_s: float
) -> None:
    """The end-to-end exercise (module docstring) on a running plane, and what must hold:
    chats in time, every request completed once, evictions and a model swap."""
    base = f"http://127.0.0.1:{plane.port}"
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        backlog = await submit_batch(http, "tiny-a", backlog_n, 1500)
        # Both engines full of long batch requests, most of their work ahead of them: a
        # slot does not free before an interactive deadline, so only eviction serves it.
        # (A fixed sleep instead let a fast, quiet machine finish most of the backlog
        # first; a slot then freed in time and nothing was evicted, rightly.)
        await running(plane, backlog, 8, timeout_s=30)
        chats = [await interactive(client) for _ in range(chats_n)]
        other_model = await submit_batch(http, "tiny-b", 3, 32)
        await wait_terminal(plane, backlog + other_model, timeout_s)

    breakdown = [hops(r) for r in await records(plane, [c[3] for c in chats])]
    print("interactive:", [round(c[0], 2) for c in chats], *breakdown, sep="\n  ")
    for ttft_s, text, tokens, _ in chats:
        assert ttft_s < INTERACTIVE_TTFT_S, breakdown
        assert text
        assert tokens == 16
    done = await records(plane, backlog + other_model)
    assert all(r.state is RequestState.COMPLETED for r in done)
    assert all(r.result is not None and r.result.output_tokens >= 1 for r in done)
    completed = sum(a.counters.completed for a in plane.agents)
    assert completed == len(done) + len(chats)  # one accepted result per request
    assert sum(r.evictions for r in done) >= 1
    assert sum(a.counters.evictions for a in plane.agents) >= 1
    assert sum(a.counters.swaps for a in plane.agents) >= 1


async def test_interactive_met_batch_completes_evictions_and_a_swap_happen(
    tiny_models: dict[str, Path],  # noqa: F811
    redis_url: str,
) -> None:
    async with running_plane(plane_config(tiny_models, redis_url)) as plane:
        # 4 rounds of 8: a fast machine ended 16 such requests within 20 s.
        await backlog_chats_and_swap(plane, backlog_n=32, chats_n=4, timeout_s=800)
        models = {a.engine.observe().model for a in plane.agents}
        assert "tiny-b" in models or any(a.counters.swaps >= 2 for a in plane.agents)
