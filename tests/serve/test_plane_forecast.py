"""The API of a running plane forecasts waits with the dispatch decision (qlm/api/wait_forecast.py)
once the agents have reported, and from the plan alone with `api.wait_forecast: false`."""

from __future__ import annotations

import asyncio

import httpx

from qlm.serve.config import ServeConfig
from qlm.serve.runtime import running_plane
from tests.serve.test_plane import config

BODY = {"kind": "completion", "model": "m-a", "prompt": "hi", "max_tokens": 200}


async def bases(cfg: ServeConfig, count: int) -> list[str]:
    """The estimate bases of `count` batch submissions, made once every agent has reported."""
    async with running_plane(cfg) as plane:
        for _ in range(100):
            if len(await plane.queue.instances()) == len(plane.fleet.instances):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.1)  # the API re-reads the reports at most every second
        base = f"http://127.0.0.1:{plane.port}"
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            out = []
            for _ in range(count):
                answer = await http.post("/v1/qlm/requests", json={**BODY, "slo_class": "batch-2"})
                assert answer.status_code == 202, answer.text
                out.append(answer.headers["x-qlm-estimate-basis"])
            return out


async def test_the_api_forecasts_with_the_dispatch_decision() -> None:
    cfg = config([{"id": "i", "gpu_type": "A100", "model": "m-a", "count": 2}])
    got = await bases(cfg, 5)
    assert set(got) == {"schedule"}, got


async def test_without_the_forecast_the_plan_estimates() -> None:
    cfg = config([{"id": "i", "gpu_type": "A100", "model": "m-a", "count": 2}])
    off = cfg.model_copy(update={"api": cfg.api.model_copy(update={"wait_forecast": False})})
    got = await bases(off, 5)
    assert "schedule" not in got
    assert set(got) <= {"plan", "idle", "no-plan"}, got
