"""Overload: full queues (overall, per tenant, places reserved for interactive classes) and
tenant quotas (request rate, tokens) answer 429 with Retry-After in OpenAI's format; the
optional SLO gate refuses, with its reason, a request the latest plan says will be late."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from qlm.api import ApiAppConfig, create_app
from qlm.api.tokens import Utf8BytesCounter
from qlm.clock import VirtualClock
from qlm.config.api_settings import ApiKey, QuotaConfig
from qlm.control.plan import PlanForecast, PlannedGroup, PublishedPlan
from qlm.queue.memory import MemoryQueue, MemoryQueueConfig
from qlm.types import RequestState
from tests.api.conftest import NOW_S, make_settings, serving

pytestmark = pytest.mark.timeout(60)
SUBMIT = "/v1/qlm/requests"
KEYS = {"alpha": "sk-alpha-0123456789", "beta": "sk-beta-9876543210"}


def body(**fields: Any) -> dict[str, Any]:
    return {"kind": "completion", "model": "m7b", "prompt": "hi", "max_tokens": 8, **fields}


def as_tenant(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


def keyed(**overrides: Any) -> ApiAppConfig:
    keys = tuple(ApiKey(key=k, tenant=t) for t, k in KEYS.items())
    return make_settings(api_keys=keys, **overrides)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(NOW_S)


@pytest.fixture
async def clients(clock: VirtualClock) -> AsyncIterator[Any]:
    """Builds an app on a memory queue with the given options; yields (client, queue)."""
    made: list[httpx.AsyncClient] = []

    def build(
        settings: ApiAppConfig, **queue_options: Any
    ) -> tuple[httpx.AsyncClient, MemoryQueue]:
        queue = MemoryQueue(MemoryQueueConfig(**queue_options))
        app = create_app(settings, queue, clock)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a")
        made.append(client)
        return client, queue

    yield build
    for client in made:
        await client.aclose()


def assert_429(resp: httpx.Response, code: str, retry_after: str | None) -> dict[str, Any]:
    assert resp.status_code == 429, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert resp.headers.get("retry-after") == retry_after
    return dict(error)


# -- bounded queues ---------------------------------------------------------------------------


async def test_a_full_queue_answers_429_with_retry_after(clients: Any) -> None:
    client, queue = clients(make_settings(queue_full_retry_after_s=7), max_queued=2)
    for _ in range(2):
        assert (await client.post(SUBMIT, json=body())).status_code == 202
    error = assert_429(await client.post(SUBMIT, json=body()), "queue_full", "7")
    assert error["type"] == "rate_limit_error"
    assert "maximum of 2 queued requests" in error["message"]
    assert (await queue.counts())[RequestState.QUEUED] == 2


async def test_a_tenant_at_its_bound_is_refused_and_others_are_not(clients: Any) -> None:
    client, _ = clients(keyed(), max_queued_per_tenant=2)
    for _ in range(2):
        resp = await client.post(SUBMIT, json=body(), headers=as_tenant("alpha"))
        assert resp.status_code == 202
    refused = await client.post(SUBMIT, json=body(), headers=as_tenant("alpha"))
    assert "tenant 'alpha'" in assert_429(refused, "tenant_queue_full", "1")["message"]
    assert (await client.post(SUBMIT, json=body(), headers=as_tenant("beta"))).status_code == 202


async def test_places_are_kept_for_interactive_requests(clients: Any) -> None:
    client, _ = clients(make_settings(), max_queued=3, reserved_queued=1)
    for _ in range(2):
        assert (await client.post(SUBMIT, json=body(slo_class="batch-2"))).status_code == 202
    refused = await client.post(SUBMIT, json=body(slo_class="batch-1"))
    assert "kept for interactive" in assert_429(refused, "queue_full", "1")["message"]
    assert (await client.post(SUBMIT, json=body(slo_class="interactive"))).status_code == 202
    assert_429(await client.post(SUBMIT, json=body(slo_class="interactive")), "queue_full", "1")


# -- quotas -------------------------------------------------------------------------------------


async def test_request_rate_quota_per_tenant(clients: Any, clock: VirtualClock) -> None:
    settings = keyed(
        quota=QuotaConfig(requests_per_s=0.5, burst_requests=2),
        tenant_quotas={"beta": QuotaConfig()},  # beta: no limit
    )
    client, queue = clients(settings)
    alpha = as_tenant("alpha")
    for _ in range(2):
        assert (await client.post(SUBMIT, json=body(), headers=alpha)).status_code == 202
    error = assert_429(
        await client.post(SUBMIT, json=body(), headers=alpha), "rate_limit_exceeded", "2"
    )
    assert "request rate" in error["message"]
    for _ in range(5):
        assert (
            await client.post(SUBMIT, json=body(), headers=as_tenant("beta"))
        ).status_code == 202
    clock.advance_by(1.0)  # half a request back: still refused, one more second to go
    assert_429(await client.post(SUBMIT, json=body(), headers=alpha), "rate_limit_exceeded", "1")
    clock.advance_by(1.0)
    assert (await client.post(SUBMIT, json=body(), headers=alpha)).status_code == 202
    assert (await queue.counts())[RequestState.QUEUED] == 8


async def test_token_quota_charges_prompt_and_output_cap(clients: Any, clock: VirtualClock) -> None:
    client, _ = clients(keyed(quota=QuotaConfig(tokens_per_min=600, burst_tokens=100)))
    prompt_tokens = Utf8BytesCounter().count("hi")
    cost = prompt_tokens + 60
    alpha = as_tenant("alpha")
    assert (await client.post(SUBMIT, json=body(max_tokens=60), headers=alpha)).status_code == 202
    # 100 - cost left, refilling at 10 tokens/s: the next wait is ceil((cost - left) / 10) s.
    left = 100 - cost
    wait_s = -(-(cost - left) // 10)
    resp = await client.post(SUBMIT, json=body(max_tokens=60), headers=alpha)
    assert_429(resp, "token_quota_exceeded", str(wait_s))
    assert (await client.post(SUBMIT, json=body(max_tokens=5), headers=alpha)).status_code == 202
    clock.advance_by(60.0)
    # A request larger than the burst is admitted from a full bucket (and leaves it in debt).
    assert (await client.post(SUBMIT, json=body(max_tokens=300), headers=alpha)).status_code == 202
    assert (await client.post(SUBMIT, json=body(max_tokens=1), headers=alpha)).status_code == 429


async def test_a_refused_enqueue_gives_its_quota_back(clients: Any) -> None:
    settings = keyed(quota=QuotaConfig(requests_per_s=0.001, burst_requests=2))
    client, queue = clients(settings, max_queued=1)
    alpha = as_tenant("alpha")
    first = await client.post(SUBMIT, json=body(), headers=alpha)
    assert first.status_code == 202
    assert_429(await client.post(SUBMIT, json=body(), headers=alpha), "queue_full", "1")
    await queue.pull("i0", [first.json()["id"]], 10.0, NOW_S)
    # The refused request's charge came back, so the burst's second place is still there.
    assert (await client.post(SUBMIT, json=body(), headers=alpha)).status_code == 202
    assert_429(await client.post(SUBMIT, json=body(), headers=alpha), "rate_limit_exceeded", "1000")


async def test_openai_client_sees_rate_limit_errors(clients: Any, clock: VirtualClock) -> None:
    settings = keyed(quota=QuotaConfig(requests_per_s=1.0, burst_requests=1))
    queue = MemoryQueue(MemoryQueueConfig(max_queued=0))
    app = create_app(settings, queue, clock)
    async with serving(app) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEYS["alpha"], max_retries=0)
        with pytest.raises(openai.RateLimitError) as full:
            await client.completions.create(model="m7b", prompt="x", max_tokens=1)
        assert full.value.code == "queue_full"
        assert full.value.response.headers["retry-after"] == "1"
        await client.close()


# -- the SLO gate -------------------------------------------------------------------------------


def plan_with_waits(
    created_at_s: float, waits_at_s: float | None = None, **waits: float
) -> PublishedPlan:
    """One planned group per (model, class) key given as model__class=wait_s."""
    groups = {}
    predicted: dict[str, float] = {}
    for key, wait_s in waits.items():
        model, slo_class = key.split("__")
        rid = f"q-{key}"
        groups[key] = PlannedGroup(key, model, slo_class.replace("_", "-"), (rid,))
        predicted[rid] = wait_s
    queues = {"i0": tuple(groups)}
    return PublishedPlan(
        0, created_at_s, queues, groups, forecast=PlanForecast(predicted, waits_at_s)
    )


async def test_the_gate_refuses_what_the_plan_says_will_be_late(
    clients: Any, clock: VirtualClock
) -> None:
    settings = make_settings(reject_unattainable_slo=True, plan_refresh_s=0.0, plan_max_age_s=60)
    client, queue = clients(settings)
    await queue.publish_plan(plan_with_waits(NOW_S, m7b__interactive=50.0, m13b__interactive=5.0))
    refused = await client.post(SUBMIT, json=body(slo_class="interactive"))
    assert refused.status_code == 429
    assert refused.headers["x-should-retry"] == "false"
    assert refused.headers["retry-after"] == "30"  # when 50 s would fit the 20 s target
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("slo_unattainable", "slo_class")
    assert "in 50.0 s, after its TTFT target of 20.0 s" in error["message"]
    # A model the plan has time for passes, unless the request's own target is tighter; a
    # class the plan has no group of passes (nothing is known about it).
    assert (await client.post(SUBMIT, json=body(model="m13b"))).status_code == 202
    assert (await client.post(SUBMIT, json=body(model="m13b", slo_ttft_s=2.0))).status_code == 429
    assert (await client.post(SUBMIT, json=body(slo_class="batch-1"))).status_code == 202
    # The predicted first token is an absolute time: later arrivals' deadlines reach it.
    clock.advance_by(29.0)
    assert (await client.post(SUBMIT, json=body())).status_code == 429  # deadline NOW + 49 s
    clock.advance_by(2.0)
    assert (await client.post(SUBMIT, json=body())).status_code == 202  # deadline NOW + 51 s
    # A newer plan replaces the table; once older than plan_max_age_s it says nothing.
    await queue.publish_plan(plan_with_waits(clock.now_s(), m7b__interactive=500.0))
    assert (await client.post(SUBMIT, json=body())).status_code == 429
    clock.advance_by(61.0)
    assert (await client.post(SUBMIT, json=body())).status_code == 202
    assert (await queue.counts())[RequestState.QUEUED] == 4


async def test_the_gate_measures_waits_from_the_last_full_replan(clients: Any) -> None:
    """Arrivals inserted since the re-plan move created_at_s, not the waits' origin."""
    settings = make_settings(reject_unattainable_slo=True, plan_refresh_s=0.0)
    client, queue = clients(settings)
    plan = plan_with_waits(NOW_S + 10.0, waits_at_s=NOW_S, m7b__interactive=15.0)
    assert PublishedPlan.from_json(plan.to_json()).forecast.waits_at_s == NOW_S
    await queue.publish_plan(plan)
    assert (await client.post(SUBMIT, json=body())).status_code == 202  # NOW + 15 s <= + 20 s
    assert (await client.post(SUBMIT, json=body(slo_ttft_s=14.0))).status_code == 429


async def test_the_gate_is_off_by_default(clients: Any) -> None:
    client, queue = clients(make_settings())
    await queue.publish_plan(plan_with_waits(NOW_S, m7b__interactive=500.0))
    assert (await client.post(SUBMIT, json=body())).status_code == 202


def test_the_gate_reads_the_length_of_groups_cut_from_the_agents_plan() -> None:
    """Plans published for agents list only each queue's head; a group past it keeps the
    predicted wait of its last member, and the gate's table uses that."""
    from qlm.api.wait_estimate import newcomer_times
    from qlm.control.plan import PlanForecast
    from qlm.control.plan import PlannedGroup as Group
    from qlm.control.plan import PublishedPlan as Plan

    cut = Group("g", "m7b", "batch-1", ())  # no member listed
    forecast = PlanForecast(waits_at_s=100.0, group_wait_s={"g": 90.0})
    plan = Plan(1, 100.0, {"i0": ("g",)}, {"g": cut}, forecast=forecast)
    (times,) = newcomer_times(plan).values()
    assert (times.first_token_at_s, times.done_at_s) == (190.0, None)
    assert list(newcomer_times(plan)) == [("m7b", "batch-1")]
