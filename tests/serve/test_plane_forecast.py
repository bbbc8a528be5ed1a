"""The API of a running plane forecasts waits with the dispatch decision (qlm/api/wait_forecast.py)
once the agents have reported, and from the plan alone with `api.wait_forecast: false`."""

from __future__ import annotations

import asyncio

import httpx

from qlm.config.serve_config import ServeConfig
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


async def test_the_forecast_gets_its_bound_once_enough_forecasts_have_ended() -> None:
    """x-qlm-estimated-wait-p90-s (qlm/estimator/forecast_band.py): none before nine forecasts
    of the class have ended; then the forecast plus how late those turned out."""
    cfg = config([{"id": "i", "gpu_type": "A100", "model": "m-a", "count": 2}])
    short = {**BODY, "max_tokens": 4, "slo_class": "batch-2"}
    async with running_plane(cfg) as plane:
        for _ in range(100):
            if len(await plane.queue.instances()) == len(plane.fleet.instances):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.1)  # the API re-reads the reports at most every second
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{plane.port}", timeout=60) as http:
            first = []
            for _ in range(12):
                answer = await http.post("/v1/qlm/requests", json=short)
                assert answer.status_code == 202, answer.text
                assert answer.headers["x-qlm-estimate-basis"] == "schedule"
                assert "x-qlm-estimated-wait-p90-s" not in answer.headers  # nothing learnt yet
                first.append(answer.json()["id"])
            for _ in range(200):
                views = [(await http.get(f"/v1/qlm/requests/{rid}")).json() for rid in first]
                if all(v["state"] == "completed" for v in views):
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.1)  # the next refresh reads them back
            answer = await http.post("/v1/qlm/requests", json=short)
    wait_s = float(answer.headers["x-qlm-estimated-wait-s"])
    bound_s = float(answer.headers["x-qlm-estimated-wait-p90-s"])
    assert bound_s >= 0.0
    assert abs(bound_s - wait_s) < 60.0  # the forecast moved by a residual, not replaced
