"""A real Prometheus (Debian's binary, its own config and data directory, a free port) scrapes a
running control plane with emulated engines. After some requests complete, PromQL through
Prometheus' HTTP API returns the attainment per class that the plane's /metrics reports; the
chart's alert rules load and evaluate cleanly; and the dashboard, pointed at this Prometheus,
shows the same figures."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from qlm.serve.runtime import running_plane
from tests.metrics.plane import plane_config, sample_sums, submit, wait_done
from tests.metrics.tools import ALERTS, PrometheusServer, binary
from tests.redis_server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
T = TypeVar("T")
MET = "sum by (slo_class) (qlm_slo_met_total)"
EVALUATED = "sum by (slo_class) (qlm_slo_evaluated_total)"


@pytest.fixture
def api_port() -> int:
    return free_port()


@pytest.fixture
def prometheus(api_port: int) -> Iterator[PrometheusServer]:
    binary("prometheus")
    server = PrometheusServer([f"127.0.0.1:{api_port}"], scrape_interval_s=0.5, rule_files=[ALERTS])
    with server:
        yield server


async def query(http: httpx.AsyncClient, promql: str) -> dict[str, float]:
    response = await http.get("/api/v1/query", params={"query": promql})
    body = response.json()
    assert body["status"] == "success", body
    return {r["metric"].get("slo_class", ""): float(r["value"][1]) for r in body["data"]["result"]}


async def eventually(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout_s: float = 30.0
) -> T:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await probe()
        if done(value) or asyncio.get_running_loop().time() > deadline:
            return value
        await asyncio.sleep(0.25)


async def test_prometheus_scrapes_the_plane_and_returns_its_attainment(
    prometheus: PrometheusServer, api_port: int
) -> None:
    cfg = plane_config(
        [{"id": "i", "gpu_type": "A100", "model": "m-a", "count": 2}],
        speedup=20.0,
        api={"port": api_port},
        metrics={"sample_every_s": 0.2, "prometheus_url": prometheus.url},
    )
    async with (
        running_plane(cfg) as plane,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{plane.port}") as api,
    ):
        ids = await submit(api, 6, "m-a", 8, slo_class="batch-2")
        ids += await submit(api, 3, "m-b", 8, slo_class="interactive")
        # Targets no engine can meet: these complete, but miss their SLO.
        ids += await submit(api, 2, "m-a", 8, slo_class="interactive", slo_ttft_s=0.001)
        await wait_done(plane, ids)
        text = (await api.get("/metrics")).text
        met = sample_sums(text, "qlm_slo_met_total", "slo_class")
        evaluated = sample_sums(text, "qlm_slo_evaluated_total", "slo_class")
        assert evaluated == {"interactive": 5, "batch-2": 6}
        assert met["interactive"] < evaluated["interactive"]

        async with httpx.AsyncClient(base_url=prometheus.url, timeout=10) as prom:
            seen = await eventually(lambda: query(prom, EVALUATED), lambda v: v == evaluated)
            assert seen == evaluated, prometheus.log()[-2000:]
            assert await query(prom, MET) == met
            ratio = await query(prom, f"{MET} / {EVALUATED}")
            assert ratio == pytest.approx({c: met[c] / evaluated[c] for c in evaluated})
            await assert_rules_evaluate(prom)
            up = await query(prom, 'up{job="qlm"}')
            assert list(up.values()) == [1.0]

        view = (await api.get("/dashboard/data")).json()
    assert view["source"] == "prometheus"
    for slo_class, n in evaluated.items():
        assert view["attainment"][slo_class]["evaluated"] == n
        assert view["attainment"][slo_class]["met"] == met[slo_class]
    assert view["history"], "a range query over the scraped series"
    assert {i["instance_id"] for i in view["instances"]} == {"i-0", "i-1"}


async def assert_rules_evaluate(prom: httpx.AsyncClient) -> None:
    """The chart's rules file loads in a real Prometheus and every rule evaluates."""

    async def rules() -> list[dict[str, Any]]:
        body = (await prom.get("/api/v1/rules")).json()
        return [r for g in body["data"]["groups"] for r in g["rules"]]

    loaded = await eventually(rules, lambda rs: bool(rs) and all(r["health"] == "ok" for r in rs))
    assert loaded
    assert {r["name"] for r in loaded} >= {"QlmSloAttainmentBelowTarget", "QlmQueueGrowing"}
    assert all(r["health"] == "ok" for r in loaded), [r.get("lastError") for r in loaded]
    recorded = await eventually(lambda: query(prom, "qlm:slo_attainment_target"), lambda v: bool(v))
    assert recorded == {"interactive": 0.99, "batch-2": 0.99}
