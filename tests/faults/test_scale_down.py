"""Autoscaling live: the controller's desired replicas grow with the load and shrink after it,
and a scale-down drains the instances it removes before they go (qlm/serve/pool_scaling.py).

The test plays the StatefulSet controller that an HPA drives from the published gauge
`qlm_pool_desired_replicas{pool}`: it keeps agents i-0 .. i-(desired - 1) running, starting
agent processes on scale-up and killing them with SIGKILL on scale-down (harsher than a pod's
SIGTERM). A steady stream of batch requests needs more than one instance, so the pool grows
to 3; once the stream ends it shrinks to 1. A last wave of long requests (one per slot)
keeps the instances it gives up busy when the drain starts, and every request must end
exactly once, dispatched once: nothing the killed agents held comes back through a lease."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.faults.harness import (
    PROFILE,
    FaultPlane,
    FaultRedis,
    QlmProcess,
    fleet_config,
    judge_async,
    views_via,
    wait_terminal,
)
from tests.faults.report import FaultReport
from tests.redis_server import free_port

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(300)]

TOKENS = 200  # 4 s at 20 ms per token; 4 run at once on an instance
RATE_PER_S = 2.0  # about 2 instances' worth
SUBMIT_S = 20.0
TAIL = 12  # then a last wave of long requests, one per slot of the grown pool:
TAIL_TOKENS = 600  # 12 s each, so they still run when the shrink begins (~6 s later)
INSTANCES = ("i-0", "i-1", "i-2")


def scaling_config(redis_url: str) -> dict[str, object]:
    config = fleet_config(redis_url, count=len(INSTANCES))
    qlm = dict(config["qlm"])
    qlm["autoscale"] = {
        "pools": [{"name": "p", "instance_prefix": "i", "min_replicas": 1, "max_replicas": 3}],
        "window_s": 4.0,
        "scale_down_stabilization_s": 2.0,
        "drain_timeout_s": 120.0,
    }
    fleet = dict(config["fleet"])
    fleet["profiles"] = [PROFILE | {"output_tokens_mean": 400, "max_batch_size": 4}]
    return config | {"qlm": qlm, "fleet": fleet}


async def gauges(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    text = (await http.get(url)).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("qlm_pool_") and sample.labels.get("pool") == "p"
    }


class StatefulSet:
    """Follows the desired replicas the controller publishes, as a StatefulSet under an HPA."""

    def __init__(self, plane: FaultPlane, metrics_url: str, first: QlmProcess) -> None:
        self.plane = plane
        self.metrics_url = metrics_url
        self.agents: dict[str, QlmProcess] = {"i-0": first}
        self.seen: list[dict[str, float]] = []
        self.removed_at_s: dict[str, float] = {}
        self.busy_when_draining: set[str] = set()

    async def follow(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as http:
            while not stop.is_set():
                now = await gauges(http, self.metrics_url)
                if "qlm_pool_desired_replicas" in now:
                    self.seen.append(now)
                    await self._note_draining(now)
                    self._resize(int(now["qlm_pool_desired_replicas"]))
                await asyncio.sleep(0.1)

    async def _note_draining(self, now: dict[str, float]) -> None:
        if now.get("qlm_pool_draining_instances", 0) > 0:
            statuses = await self.plane.statuses()
            for iid in INSTANCES[1:]:
                if iid in self.agents and (s := statuses.get(iid)) and s.running > 0:
                    self.busy_when_draining.add(iid)

    def _resize(self, desired: int) -> None:
        for k, iid in enumerate(INSTANCES):
            if k < desired and iid not in self.agents:
                self.agents[iid] = self.plane.agent(iid)
            elif k >= desired and iid in self.agents:
                self.agents.pop(iid).kill9()
                self.removed_at_s[iid] = time.monotonic()


async def submit(http: httpx.AsyncClient, index: int, tokens: int) -> str:
    body = {
        "kind": "completion",
        "model": PROFILE["model"],
        "prompt": f"scaling document {index}",
        "max_tokens": tokens,
        "slo_class": "batch-2",
    }
    response = await http.post("/v1/qlm/requests", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def submit_steadily(api_url: str) -> list[str]:
    ids: list[str] = []
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=api_url, timeout=10.0) as http:
        while time.monotonic() - started < SUBMIT_S:
            ids.append(await submit(http, len(ids), TOKENS))
            await asyncio.sleep(1.0 / RATE_PER_S)
        for _ in range(TAIL):
            ids.append(await submit(http, len(ids), TAIL_TOKENS))
    return ids


async def test_pool_grows_with_load_and_drains_before_shrinking(
    fault_redis: FaultRedis, tmp_path: Path
) -> None:
    report = FaultReport("scale-down drain")
    metrics_port = free_port()
    with FaultPlane(scaling_config(fault_redis.url), tmp_path) as plane:
        try:
            api = plane.api()
            controller = plane._start(
                "controller", ["controller", "--metrics-port", str(metrics_port)], port=None
            )
            first = plane.agent("i-0")
            await plane.ready(api, controller, first)
            pool = StatefulSet(plane, f"http://127.0.0.1:{metrics_port}/metrics", first)
            stop = asyncio.Event()
            follower = asyncio.create_task(pool.follow(stop))
            ids = await submit_steadily(api.url)
            for rid in ids:
                report.accept(rid, "async")
            records = await wait_terminal(plane, ids, timeout_s=150.0)
            deadline = time.monotonic() + 60.0
            while len(pool.agents) > 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)  # the shrink after the last request
            stop.set()
            await follower
            views = await views_via(api.url, ids)
            steady = {rid: v for rid, v in views.items() if rid not in ids[-TAIL:]}
            judge_async(report, steady, TOKENS)
            judge_async(report, {rid: views[rid] for rid in ids[-TAIL:]}, TAIL_TOKENS)
            for rid in ids:
                if (done := await plane.done_events(rid)) != 1:
                    report.duplicate(rid, f"{done} DONE events")
        finally:
            await plane.aclose()

    report.check()
    desired = [int(s["qlm_pool_desired_replicas"]) for s in pool.seen]
    assert max(desired) == 3, desired
    assert desired[-1] == 1, desired
    assert set(pool.removed_at_s) == {"i-1", "i-2"}
    served_by = {rid: r.result.instance_id for rid, r in records.items() if r and r.result}
    assert {"i-1", "i-2"} & set(served_by.values()), "the instances added served nothing"
    assert pool.busy_when_draining, "no instance was still busy when its drain began"
    for rid, record in records.items():  # nothing came back from a killed agent
        assert record is not None
        assert record.dispatches == 1, (rid, record.dispatches)
