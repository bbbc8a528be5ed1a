"""Every admitted request carries a predicted wait: the `x-qlm-estimated-wait-s` and
`x-qlm-estimate-basis` headers on completions, streams and the asynchronous 202 answer, the
same numbers on the request's record, and Retry-After on 429s taken from them. A wait read
from a plan comes with a predicted completion (`x-qlm-estimated-completion-s`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest

from qlm.api.wait_estimate import BASIS_HEADER, COMPLETION_HEADER, WAIT_HEADER
from qlm.clock import VirtualClock
from qlm.control.plan import LoneSpeed, PlanForecast, PlannedGroup, PublishedPlan
from qlm.queue.memory import MemoryQueue
from tests.api.conftest import NOW_S
from tests.api.fake_agent import FakeAgent

pytestmark = pytest.mark.timeout(60)
SUBMIT = "/v1/qlm/requests"


def plan(created_at_s: float, **waits: float) -> PublishedPlan:
    """One group per model__class=wait_s, waits measured from `created_at_s`."""
    groups, predicted = {}, {}
    for key, wait_s in waits.items():
        model, slo_class = key.split("__")
        groups[key] = PlannedGroup(key, model, slo_class.replace("_", "-"), (f"q-{key}",))
        predicted[f"q-{key}"] = wait_s
    forecast = PlanForecast(predicted)
    return PublishedPlan(1, created_at_s, {"i0": tuple(groups)}, groups, forecast=forecast)


def body(**fields: Any) -> dict[str, Any]:
    return {"kind": "completion", "model": "m7b", "prompt": "hi", "max_tokens": 3, **fields}


def estimate(resp: httpx.Response) -> tuple[str, str]:
    return resp.headers[WAIT_HEADER], resp.headers[BASIS_HEADER]


@pytest.fixture
async def oai(base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    yield client
    await client.close()


async def test_completions_streams_and_submissions_carry_it(
    client: httpx.AsyncClient, queue: MemoryQueue, agent: FakeAgent
) -> None:
    await queue.publish_plan(plan(NOW_S - 2.0, m7b__interactive=14.5))
    done = await client.post("/v1/completions", json={**body(), "kind": None})
    assert done.status_code == 200, done.text
    assert estimate(done) == ("12.500", "plan")  # 14.5 s from the re-plan, 2 s ago
    async with client.stream("POST", "/v1/completions", json=body(kind=None, stream=True)) as s:
        assert estimate(s) == ("12.500", "plan")
        assert [line async for line in s.aiter_lines()][-2] == "data: [DONE]"
    # No group of the model and class is planned: nothing of its kind waits ahead.
    submitted = await client.post(SUBMIT, json=body(model="m13b"))
    assert submitted.status_code == 202
    assert estimate(submitted) == ("0.000", "idle")
    view = submitted.json()
    assert (view["estimated_wait_s"], view["estimate_basis"]) == (0.0, "idle")
    record = (await client.get(f"{SUBMIT}/{view['id']}")).json()
    assert (record["estimated_wait_s"], record["estimate_basis"]) == (0.0, "idle")


async def test_a_plan_with_completions_predicts_when_the_output_ends(
    client: httpx.AsyncClient, queue: MemoryQueue
) -> None:
    """Two groups of one kind: the estimate is the group whose last first token comes first
    (the later group would finish sooner, but a newcomer does not join it)."""
    groups = {g: PlannedGroup(g, "m7b", "interactive", (f"q-{g}",)) for g in ("early", "late")}
    waits = {"q-early": 4.0, "q-late": 9.0}
    done = {"early": 30.0, "late": 12.0}
    published = PublishedPlan(
        1, NOW_S - 1.0, {"i0": ("early", "late")}, groups, forecast=PlanForecast(waits)
    )
    await queue.publish_plan(
        replace(published, forecast=replace(published.forecast, group_done_s=done))
    )
    submitted = await client.post(SUBMIT, json=body())
    assert submitted.status_code == 202, submitted.text
    assert estimate(submitted) == ("3.000", "plan")
    assert submitted.headers[COMPLETION_HEADER] == "29.000"  # 30 s from the re-plan, 1 s ago
    record = (await client.get(f"{SUBMIT}/{submitted.json()['id']}")).json()
    assert (record["estimated_wait_s"], record["estimated_completion_s"]) == (3.0, 29.0)
    # A kind with nothing planned, in a plan that knows no speeds: no completion, said by
    # the header's absence.
    idle = await client.post(SUBMIT, json=body(model="m13b"))
    assert COMPLETION_HEADER not in idle.headers
    assert idle.json()["estimated_completion_s"] is None


async def test_a_planned_request_finishes_its_own_output_at_its_groups_pace(
    client: httpx.AsyncClient, queue: MemoryQueue
) -> None:
    """With the group's decode step, the completion is the first token plus the request's
    own output: the mean (30) capped by max_tokens, or all of max_tokens under ignore_eos."""
    lone = {
        "m7b": LoneSpeed(prefill_tokens_per_s=1000.0, decode_step_s=0.02, output_tokens_mean=30)
    }
    base = plan(NOW_S, m7b__interactive=5.0)
    steps = {"m7b__interactive": 0.1}
    await queue.publish_plan(
        replace(
            base,
            forecast=replace(
                base.forecast,
                lone=lone,
                group_step_s=steps,
                group_done_s={"m7b__interactive": 99.0},
            ),
        )
    )
    cases = (({"max_tokens": 10}, "6.000"), ({}, "8.000"), ({"ignore_eos": True}, "55.000"))
    for fields, completion in cases:
        submitted = await client.post(SUBMIT, json={**body(max_tokens=500), **fields})
        assert submitted.status_code == 202, submitted.text
        assert estimate(submitted) == ("5.000", "plan")
        assert submitted.headers[COMPLETION_HEADER] == completion


async def test_with_nothing_of_its_kind_planned_a_request_is_priced_alone(
    client: httpx.AsyncClient, queue: MemoryQueue
) -> None:
    """`idle`: its prefill, then its output at the batch-1 step of the fleet's fastest
    instance for its model (`ignore_eos`: all of max_tokens, else the mean output if less)."""
    lone = {
        "m13b": LoneSpeed(prefill_tokens_per_s=1000.0, decode_step_s=0.02, output_tokens_mean=30)
    }
    base = plan(NOW_S, m7b__interactive=5.0)
    await queue.publish_plan(replace(base, forecast=replace(base.forecast, lone=lone)))
    ask = body(model="m13b", prompt="x" * 400, max_tokens=50)  # 100 prompt tokens
    for fields, completion in (({}, "0.700"), ({"ignore_eos": True}, "1.100")):  # + 0.1 s
        submitted = await client.post(SUBMIT, json={**ask, **fields})
        assert submitted.status_code == 202, submitted.text
        assert estimate(submitted) == ("0.100", "idle")
        assert submitted.headers[COMPLETION_HEADER] == completion
    unknown = await client.post(SUBMIT, json=body(slo_class="batch-2"))  # m7b: no speed
    assert unknown.status_code == 202, unknown.text
    assert estimate(unknown) == ("0.000", "idle")
    assert COMPLETION_HEADER not in unknown.headers


async def test_the_official_client_reads_it(oai: openai.AsyncOpenAI, agent: FakeAgent) -> None:
    """No plan yet: the estimate says so rather than being left out."""
    raw = await oai.chat.completions.with_raw_response.create(
        model="m7b", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert (raw.headers[WAIT_HEADER], raw.headers[BASIS_HEADER]) == ("0.000", "no-plan")
    assert raw.parse().choices[0].message.content


async def test_a_stale_plan_says_nothing(
    client: httpx.AsyncClient, queue: MemoryQueue, clock: VirtualClock
) -> None:
    await queue.publish_plan(plan(NOW_S, m7b__interactive=8.0))
    first = await client.post(SUBMIT, json=body())
    assert estimate(first) == ("8.000", "plan")
    clock.advance_by(31.0)  # past plan_max_age_s (30 s) and plan_refresh_s
    assert estimate(await client.post(SUBMIT, json=body())) == ("0.000", "no-plan")
    record = (await client.get(f"{SUBMIT}/{first.json()['id']}")).json()
    assert (record["estimated_wait_s"], record["estimate_basis"]) == (8.0, "plan")


async def test_retry_after_of_a_full_queue_is_the_predicted_wait(
    queue: MemoryQueue, clock: VirtualClock
) -> None:
    from qlm.api import create_app
    from qlm.queue.memory import MemoryQueueConfig
    from tests.api.conftest import make_settings

    full = MemoryQueue(MemoryQueueConfig(max_queued=1))
    app = create_app(make_settings(queue_full_retry_after_s=2), full, clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        assert (await c.post(SUBMIT, json=body(model="m13b"))).status_code == 202
        refused = await c.post(SUBMIT, json=body(model="m13b"))
        assert (refused.status_code, refused.headers["retry-after"]) == (429, "2")  # idle: floor
        await full.publish_plan(plan(NOW_S, m7b__interactive=39.2))
        clock.advance_by(1.0)  # plan_refresh_s
        refused = await c.post(SUBMIT, json=body())
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "39"  # ceil(39.2 - 1 s since the re-plan)
        assert estimate(refused) == ("38.200", "plan")
