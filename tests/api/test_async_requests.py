"""Asynchronous submission for batch work: 202, state while queued, the result once an agent
completes it, cancellation, the queue counts, liveness and readiness."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from qlm.api import create_app
from qlm.clock import VirtualClock
from qlm.config.api_settings import ApiAppConfig
from qlm.control.plan import PlanForecast, PlannedGroup, PublishedPlan
from qlm.queue.memory import MemoryQueue, MemoryQueueConfig
from qlm.types import RequestState
from tests.api.conftest import NOW_S, wait_until
from tests.api.fake_agent import INSTANCE, FakeAgent

SUBMIT = "/v1/qlm/requests"
BODY = {
    "kind": "chat",
    "model": "m7b",
    "messages": [{"role": "user", "content": "summarise this"}],
    "max_tokens": 3,
    "slo_class": "batch-2",
}


async def submit(client: httpx.AsyncClient, body: Mapping[str, object] = BODY) -> str:
    resp = await client.post(SUBMIT, json=body)
    assert resp.status_code == 202, resp.text
    rid: str = resp.json()["id"]
    assert resp.headers["x-qlm-request-id"] == rid
    assert resp.headers["location"] == f"{SUBMIT}/{rid}"
    return rid


async def test_lifecycle(client: httpx.AsyncClient, queue: MemoryQueue, agent: FakeAgent) -> None:
    agent.serving = False
    resp = await client.post(SUBMIT, json=BODY)
    assert resp.status_code == 202
    ack = resp.json()
    assert (ack["state"], ack["kind"], ack["slo_class"], ack["model"]) == (
        "queued",
        "chat",
        "batch-2",
        "m7b",
    )
    assert ack["max_output_tokens"] == 3
    assert ack["times"]["ttft_deadline_at_s"] == NOW_S + 3600.0
    rid = ack["id"]

    queued = (await client.get(f"{SUBMIT}/{rid}")).json()
    assert queued["state"] == "queued"
    assert queued["result"] is None
    assert (queued["group_id"], queued["predicted_wait_s"], queued["instance_id"]) == (
        None,
        None,
        None,
    )

    group = PlannedGroup("g7", "m7b", "batch-2", (rid,))
    plan = PublishedPlan(
        0, NOW_S, {INSTANCE: ("g7",)}, {"g7": group}, forecast=PlanForecast({rid: 42.0})
    )
    await queue.annotate(plan)
    planned = (await client.get(f"{SUBMIT}/{rid}")).json()
    assert (planned["group_id"], planned["predicted_wait_s"]) == ("g7", 42.0)

    agent.serving = True

    async def completed() -> bool:
        return bool((await client.get(f"{SUBMIT}/{rid}")).json()["state"] == "completed")

    await wait_until(completed)
    done = (await client.get(f"{SUBMIT}/{rid}")).json()
    assert done["instance_id"] == INSTANCE
    assert done["dispatches"] == 1
    assert done["times"]["finished_at_s"] == NOW_S
    result = done["result"]
    assert result["text"] == "w0 w1 w2 "
    assert result["finish_reason"] == "length"
    assert result["usage"]["completion_tokens"] == 3
    assert result["usage"]["prompt_tokens"] == done["prompt_tokens"]
    assert result["usage"]["total_tokens"] == done["prompt_tokens"] + 3


async def test_completion_kind(client: httpx.AsyncClient, agent: FakeAgent) -> None:
    rid = await submit(client, {"kind": "completion", "model": "m13b", "prompt": "go"})
    assert rid.startswith("req-")

    async def result() -> object:
        return (await client.get(f"{SUBMIT}/{rid}")).json()["result"]

    await wait_until(result)
    body = (await client.get(f"{SUBMIT}/{rid}")).json()
    assert body["result"]["text"] == "w0 w1 w2 w3 w4 w5 "
    assert body["max_output_tokens"] == 64  # the settings' default_max_tokens


async def test_delete_cancels_then_conflicts(client: httpx.AsyncClient, queue: MemoryQueue) -> None:
    rid = await submit(client)
    resp = await client.delete(f"{SUBMIT}/{rid}")
    assert resp.status_code == 200
    assert resp.json()["state"] == "cancelled"
    record = await queue.get(rid)
    assert record is not None
    assert record.state is RequestState.CANCELLED
    again = await client.delete(f"{SUBMIT}/{rid}")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "request_terminal"
    missing = await client.delete(f"{SUBMIT}/req-none")
    assert missing.status_code == 404


async def test_delete_of_a_completed_request_conflicts(
    client: httpx.AsyncClient, agent: FakeAgent
) -> None:
    rid = await submit(client)

    async def completed() -> bool:
        return bool((await client.get(f"{SUBMIT}/{rid}")).json()["state"] == "completed")

    await wait_until(completed)
    resp = await client.delete(f"{SUBMIT}/{rid}")
    assert resp.status_code == 409
    assert "completed" in resp.json()["error"]["message"]


async def test_queue_counts(client: httpx.AsyncClient) -> None:
    for _ in range(3):
        await submit(client)
    rid = await submit(client)
    await client.delete(f"{SUBMIT}/{rid}")
    body = (await client.get("/v1/qlm/queue")).json()
    assert body["counts"]["queued"] == 3
    assert body["counts"]["cancelled"] == 1
    assert body["counts"]["completed"] == 0
    assert set(body["counts"]) == {str(s) for s in RequestState}
    assert body["total"] == 4


async def test_health_and_readiness(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready"}


class BrokenQueue(MemoryQueue):
    async def counts(self) -> Mapping[RequestState, int]:
        raise ConnectionError("redis is down")


async def test_not_ready_when_queue_unreachable(
    settings: ApiAppConfig, clock: VirtualClock
) -> None:
    app = create_app(settings, BrokenQueue(), clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        resp = await c.get("/readyz")
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == "not_ready"
        assert (await c.get("/healthz")).status_code == 200  # alive all the same


async def test_full_queue_is_429(settings: ApiAppConfig, clock: VirtualClock) -> None:
    app = create_app(settings, MemoryQueue(MemoryQueueConfig(max_queued=1)), clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        assert (await c.post(SUBMIT, json=BODY)).status_code == 202
        resp = await c.post(SUBMIT, json=BODY)
        assert resp.status_code == 429
        assert resp.json()["error"]["code"] == "queue_full"
        assert resp.headers["retry-after"] == "1"


class CharCounter:
    """A stand-in for a model's tokenizer: one token per character."""

    def count(self, text: str) -> int:
        return max(1, len(text))


async def test_custom_token_counter(settings: ApiAppConfig, clock: VirtualClock) -> None:
    app = create_app(settings, MemoryQueue(), clock, token_counter=CharCounter())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        body = {"kind": "completion", "model": "m7b", "prompt": "twelve chars"}
        resp = await c.post(SUBMIT, json=body)
    assert resp.json()["prompt_tokens"] == 12
