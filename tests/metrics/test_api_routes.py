"""The API's operator routes in process: /metrics counts what the API admitted, refused and
cancelled; /dashboard serves its page and assets; /dashboard/data reads the same registry."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from qlm.api import create_app
from qlm.clock import VirtualClock
from qlm.metrics import PlaneMetrics
from qlm.queue.memory import MemoryQueue
from tests.api.conftest import CLASSES, make_settings


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    queue = MemoryQueue()
    app = create_app(make_settings(), queue, VirtualClock(1_000.0))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
        yield c
    await queue.close()


async def scrape(client: httpx.AsyncClient, name: str, **labels: str) -> float:
    text = (await client.get("/metrics")).text
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert values, f"{name} {labels} not exported"
    return sum(values)


def submission(model: str = "m7b", slo_class: str = "batch-2") -> dict[str, object]:
    return {"kind": "completion", "model": model, "prompt": "hi", "slo_class": slo_class}


async def test_metrics_count_admitted_rejected_and_cancelled_requests(
    client: httpx.AsyncClient,
) -> None:
    ids = []
    for _ in range(3):
        response = await client.post("/v1/qlm/requests", json=submission())
        assert response.status_code == 202
        ids.append(response.json()["id"])
    assert (await client.post("/v1/qlm/requests", json=submission("nope"))).status_code == 404
    too_long = {**submission(), "max_tokens": 100_000}
    assert (await client.post("/v1/qlm/requests", json=too_long)).status_code == 400
    assert (await client.delete(f"/v1/qlm/requests/{ids[0]}")).status_code == 200

    batch = {"model_name": "m7b", "slo_class": "batch-2"}
    assert await scrape(client, "qlm_requests_total", **batch, outcome="admitted") == 3
    assert await scrape(client, "qlm_requests_total", **batch, outcome="rejected") == 1
    assert await scrape(client, "qlm_requests_total", **batch, outcome="cancelled") == 1
    assert await scrape(client, "qlm_requests_total", model_name="other", outcome="rejected") == 1
    assert await scrape(client, "qlm_request_rejections_total", reason="model_not_found") == 1
    assert (
        await scrape(client, "qlm_request_rejections_total", reason="context_length_exceeded") == 1
    )


async def test_bodies_refused_before_admission_are_counted_too(
    client: httpx.AsyncClient,
) -> None:
    chat = {"model": "m7b", "messages": [{"role": "user", "content": "hi"}]}
    assert (await client.post("/v1/chat/completions", content=b'{"model": ')).status_code == 400
    with_tools = {**chat, "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert (await client.post("/v1/chat/completions", json=with_tools)).status_code == 400
    huge = {**chat, "messages": [{"role": "user", "content": "x" * 5_000_000}]}
    assert (await client.post("/v1/chat/completions", json=huge)).status_code == 413
    bad_kind = {**submission(), "max_tokens": "5"}
    assert (await client.post("/v1/qlm/requests", json=bad_kind)).status_code == 400

    assert await scrape(client, "qlm_request_rejections_total", reason="invalid_json") == 1
    unsupported = await scrape(
        client, "qlm_request_rejections_total", reason="unsupported_parameter"
    )
    assert unsupported == 1
    assert await scrape(client, "qlm_request_rejections_total", reason="request_too_large") == 1
    assert await scrape(client, "qlm_request_rejections_total", reason="invalid_request_error") == 1
    # Refused before its model was known: 3; `tools` is refused once the model (and so the
    # engine kind serving it) is known, so it counts under its model.
    assert await scrape(client, "qlm_requests_total", model_name="other", outcome="rejected") == 3
    assert await scrape(client, "qlm_requests_total", model_name="m7b", outcome="rejected") == 1


async def test_scrapers_asking_for_openmetrics_get_it(client: httpx.AsyncClient) -> None:
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    response = await client.get("/metrics", headers={"accept": accept})
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")
    plain = await client.get("/metrics")
    assert plain.headers["content-type"].startswith("text/plain")
    assert "vllm:" not in plain.text


async def test_dashboard_page_assets_and_data(client: httpx.AsyncClient) -> None:
    page = await client.get("/dashboard")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    for asset in ("dashboard/static/dashboard.js", "dashboard/static/dashboard.css"):
        assert asset in page.text
        assert (await client.get("/" + asset)).status_code == 200
    assert "http" not in page.text.replace("http://www.w3.org", "")  # nothing from elsewhere
    assert (await client.get("/dashboard/static/dashboard.html")).status_code == 404  # listed only
    data = (await client.get("/dashboard/data")).json()
    assert data["classes"] == [c.name for c in CLASSES]
    assert data["source"] == "local"
    assert data["attainment"]["interactive"] == {
        "met": 0.0,
        "evaluated": 0.0,
        "ratio": None,
        "target": 0.99,
    }


async def test_an_app_given_a_recorder_exports_its_registry() -> None:
    registry = CollectorRegistry()
    clock = VirtualClock(0.0)
    metrics = PlaneMetrics(registry, clock, slo_classes=("interactive",), models=("m7b",))
    metrics.model_swap_started("i0", "m7b")  # recorded elsewhere in the process
    queue = MemoryQueue()
    app = create_app(make_settings(), queue, clock, metrics=metrics)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        assert await scrape(c, "qlm_model_swaps_total", instance_id="i0") == 1
        data = (await c.get("/dashboard/data")).json()
    assert [e["kind"] for e in data["events"]] == ["swap"]
    await queue.close()
