"""A live plane records where events happen: agents (completions, evictions, swaps, instance
state), the control loop (leadership, queue, planner, predicted waits) and the API, on one
registry; processes without the API serve it on their own metrics port."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from qlm.clock import WallClock
from qlm.serve.runtime import running_plane
from qlm.types import Request, SloClass
from tests.metrics.plane import plane_config, sample, submit, wait_done

pytestmark = pytest.mark.timeout(120)


async def test_controller_and_agent_without_api_serve_metrics_on_their_own_port() -> None:
    cfg = plane_config([{"id": "i", "gpu_type": "A100", "model": "m-a"}], speedup=5.0)
    clock = WallClock()
    async with running_plane(cfg, clock=clock, api=False, metrics_port=0) as plane:
        assert plane.port is None
        assert plane.metrics_port is not None
        batch = SloClass("batch-2", ttft_s=600.0)
        now_s = clock.now_s()
        requests = [Request.create(f"r{i}", "m-b", 10, 5, batch, now_s) for i in range(3)]
        for request in requests:
            await plane.queue.enqueue(request)
        await wait_done(plane, [r.id for r in requests])
        await asyncio.sleep(0.3)  # a status report and a queue sample after the last result
        url = f"http://127.0.0.1:{plane.metrics_port}/metrics"
        async with httpx.AsyncClient() as http:
            text = (await http.get(url)).text

    labels = {"model_name": "m-b", "slo_class": "batch-2"}
    assert sample(text, "qlm_requests_total", **labels, outcome="completed") == 3
    assert sample(text, "qlm_slo_met_total", **labels, instance_id="i") == 3
    assert sample(text, "qlm_slo_evaluated_total", **labels, instance_id="i") == 3
    assert sample(text, "qlm_request_ttft_seconds_count", **labels) == 3
    assert sample(text, "qlm_model_swaps_total", instance_id="i", model_name="m-b") == 1
    assert sample(text, "qlm_model_swap_seconds_count", model_name="m-b") == 1
    assert sample(text, "qlm_instance_state", instance_id="i", state="ready", model_name="m-b") == 1
    assert sample(text, "qlm_instance_state", instance_id="i", model_name="m-a") == 0
    assert sample(text, "qlm_controller_leading") == 1
    assert sample(text, "qlm_planner_runs_total", status="heuristic") >= 1
    predicted = sample(text, "qlm_wait_predicted_seconds_count", **labels)
    assert predicted >= 1  # those a full re-plan placed (arrivals may join a group instead)
    # Every predicted request completed in this process, so each prediction was paired.
    assert sample(text, "qlm_wait_prediction_error_seconds_count", slo_class="batch-2") == predicted
    assert sample(text, "qlm_queue_depth", **labels) == 0
    # No API in this process: nothing admitted here.
    assert sample(text, "qlm_requests_total", outcome="admitted") == 0


async def test_evictions_in_metrics_match_the_agents_counters() -> None:
    cfg = plane_config([{"id": "i", "gpu_type": "A100", "model": "m-a"}])
    async with running_plane(cfg) as plane:
        base = f"http://127.0.0.1:{plane.port}"
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            batch = await submit(http, 2, "m-a", 100, slo_class="batch-2")  # 2 s each
            await asyncio.sleep(0.3)  # both engine slots run batch work
            interactive = await submit(http, 1, "m-a", 2, slo_class="interactive", slo_ttft_s=0.5)
            await wait_done(plane, [*batch, *interactive])
            text = (await http.get("/metrics")).text
        evictions = sum(a.counters.evictions for a in plane.agents)
    assert evictions >= 1
    assert sample(text, "qlm_evictions_total", instance_id="i", slo_class="batch-2") == evictions
    assert sample(text, "qlm_requests_total", outcome="admitted") == 3
    assert sample(text, "qlm_requests_total", outcome="completed") == 3
    assert sample(text, "qlm_slo_evaluated_total") == 3
