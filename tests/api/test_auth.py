"""API keys and tenants: a key names its tenant, a missing or unknown key is a 401 in
OpenAI's format, a tenant reads and cancels only its own requests (another's id answers
exactly like an unknown one), and the official openai client works with a key unchanged."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from qlm.api import ApiAppConfig, create_app
from qlm.clock import VirtualClock
from qlm.config.api_settings import ApiKey
from qlm.queue.memory import MemoryQueue
from qlm.types import RequestState
from tests.api.conftest import make_settings, serving, wait_until
from tests.api.fake_agent import FakeAgent

pytestmark = pytest.mark.timeout(60)
ALPHA, ALPHA_2, BETA = "sk-alpha-0123456789", "sk-alpha-rotated-99", "sk-beta-9876543210"
SUBMIT = "/v1/qlm/requests"
BODY = {"kind": "completion", "model": "m7b", "prompt": "hello"}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def keyed_settings(**overrides: Any) -> ApiAppConfig:
    keys = (
        ApiKey(key=ALPHA, tenant="alpha"),
        ApiKey(key=ALPHA_2, tenant="alpha"),  # two keys of one tenant: rotation
        ApiKey(key=BETA, tenant="beta"),
    )
    return make_settings(api_keys=keys, **overrides)


@pytest.fixture
def settings() -> ApiAppConfig:
    return keyed_settings()


async def submit(client: httpx.AsyncClient, key: str, **fields: Any) -> dict[str, Any]:
    resp = await client.post(SUBMIT, json={**BODY, **fields}, headers=bearer(key))
    assert resp.status_code == 202, resp.text
    return dict(resp.json())


UNAUTHORIZED: list[Any] = [
    pytest.param({}, "missing_api_key", id="no-header"),
    pytest.param({"authorization": ""}, "missing_api_key", id="empty-header"),
    pytest.param({"authorization": f"Basic {ALPHA}"}, "invalid_authorization", id="basic"),
    pytest.param({"authorization": "Bearer"}, "invalid_authorization", id="no-token"),
    pytest.param(bearer("sk-guess-000000000"), "invalid_api_key", id="unknown-key"),
    pytest.param(bearer(ALPHA + "x"), "invalid_api_key", id="key-prefix"),
]
ROUTES = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", SUBMIT),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/m7b"),
    ("GET", f"{SUBMIT}/req-1"),
    ("DELETE", f"{SUBMIT}/req-1"),
    ("GET", "/v1/qlm/queue"),
]


@pytest.mark.parametrize(("headers", "code"), UNAUTHORIZED)
@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
async def test_missing_or_unknown_keys_are_401(
    client: httpx.AsyncClient,
    queue: MemoryQueue,
    headers: dict[str, str],
    code: str,
    method: str,
    path: str,
) -> None:
    resp = await client.request(method, path, json=BODY, headers=headers)
    assert resp.status_code == 401, resp.text
    assert resp.headers["www-authenticate"] == "Bearer"
    error = resp.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, code)
    assert ALPHA not in resp.text
    assert "sk-guess" not in resp.text  # a presented token is never echoed
    assert sum((await queue.counts()).values()) == 0


async def test_authentication_comes_before_body_validation(client: httpx.AsyncClient) -> None:
    resp = await client.post(SUBMIT, content=b"{not json", headers=bearer("sk-nobody-0000000"))
    assert resp.status_code == 401


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/openapi.json"])
async def test_probes_and_the_schema_need_no_key(client: httpx.AsyncClient, path: str) -> None:
    assert (await client.get(path)).status_code == 200


async def test_the_key_names_the_tenant_and_the_user_field_does_not(
    client: httpx.AsyncClient, queue: MemoryQueue
) -> None:
    first = await submit(client, ALPHA, user="beta")
    second = await submit(client, ALPHA_2)
    third = await submit(client, BETA, user="alpha")
    tenants = []
    for view in (first, second, third):
        record = await queue.get(view["id"])
        assert record is not None
        tenants.append(record.request.tenant)
    assert tenants == ["alpha", "alpha", "beta"]


async def test_a_tenant_reads_and_cancels_only_its_own_requests(
    client: httpx.AsyncClient, queue: MemoryQueue
) -> None:
    rid = (await submit(client, ALPHA))["id"]
    url = f"{SUBMIT}/{rid}"
    unknown_url = f"{SUBMIT}/req-{'0' * 32}"
    for method in ("GET", "DELETE"):
        other = await client.request(method, url, headers=bearer(BETA))
        unknown = await client.request(method, unknown_url, headers=bearer(BETA))
        assert other.status_code == unknown.status_code == 404
        # Same answer as for an id that does not exist, apart from the id itself.
        assert other.text.replace(rid, "ID") == unknown.text.replace(f"req-{'0' * 32}", "ID")
    record = await queue.get(rid)
    assert record is not None
    assert record.state is RequestState.QUEUED  # beta's DELETE changed nothing
    mine = await client.get(url, headers=bearer(ALPHA_2))  # any key of the tenant
    assert mine.status_code == 200
    assert mine.json()["tenant"] == "alpha"
    cancelled = await client.delete(url, headers=bearer(ALPHA))
    assert (cancelled.status_code, cancelled.json()["state"]) == (200, "cancelled")


async def test_without_keys_everyone_is_anonymous(queue: MemoryQueue, clock: VirtualClock) -> None:
    """The embedded default: no key needed, any id readable, tenant from `user`."""
    app = create_app(make_settings(), queue, clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        resp = await c.post(SUBMIT, json={**BODY, "user": "team-x"})
        assert resp.status_code == 202
        view = (await c.get(f"{SUBMIT}/{resp.json()['id']}")).json()
    assert view["tenant"] == "team-x"
    assert "securitySchemes" not in app.openapi()["components"]


async def test_bad_requests_of_every_kind_leave_accepted_ones_alone(
    client: httpx.AsyncClient, queue: MemoryQueue, agent: FakeAgent
) -> None:
    """Accepted before and after a barrage of refusals (401, 400, 404, 413), all served."""
    agent.serving = False
    ids = [(await submit(client, ALPHA, prompt=f"before {i}"))["id"] for i in range(3)]
    barrage: list[tuple[dict[str, str], bytes]] = [
        ({}, json.dumps(BODY).encode()),
        (bearer("sk-wrong-key-00000"), json.dumps(BODY).encode()),
        (bearer(BETA), b'{"kind": "completion", "model": '),
        (bearer(BETA), b'{"kind": "completion", "model": "m7b", "prompt": "\xff"}'),
        (bearer(BETA), json.dumps({**BODY, "model": "nope"}).encode()),
        (bearer(BETA), json.dumps({**BODY, "max_tokens": 0}).encode()),
        (bearer(BETA), json.dumps({**BODY, "deadline_s": -1}).encode()),
        (bearer(BETA), json.dumps({**BODY, "prompt": "x" * 70_000}).encode()),
    ]
    statuses = []
    for headers, body in barrage:
        resp = await client.post(SUBMIT, content=body, headers=headers)
        statuses.append(resp.status_code)
        for rid in ids:  # a refused request touches nothing, not even another tenant's view
            assert (await client.get(f"{SUBMIT}/{rid}", headers=bearer(BETA))).status_code == 404
    assert statuses == [401, 401, 400, 400, 404, 400, 400, 413]
    ids += [(await submit(client, ALPHA, prompt=f"after {i}"))["id"] for i in range(3)]
    assert (await queue.counts())[RequestState.QUEUED] == 6
    agent.serving = True

    async def all_done() -> bool:
        views = [(await client.get(f"{SUBMIT}/{i}", headers=bearer(ALPHA))).json() for i in ids]
        return [v["state"] for v in views] == ["completed"] * 6

    await wait_until(all_done)
    assert agent.served == 6


# -- the official openai client, with keys ------------------------------------------------


@pytest.fixture
async def keyed_url(app: FastAPI) -> AsyncIterator[str]:
    async with serving(app) as url:
        yield url + "/v1"


async def test_openai_client_with_a_key(
    keyed_url: str, agent: FakeAgent, queue: MemoryQueue
) -> None:
    client = openai.AsyncOpenAI(base_url=keyed_url, api_key=BETA, max_retries=0)
    chat = await client.chat.completions.create(
        model="m7b", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].message.content == "w0 w1 w2 "
    stream = await client.completions.create(model="m13b", prompt="x", max_tokens=2, stream=True)
    assert "".join([c.text async for chunk in stream for c in chunk.choices]) == "w0 w1 "
    assert [m.id for m in (await client.models.list()).data] == ["m13b", "m7b"]
    record = await queue.get(chat.id)
    assert record is not None
    assert record.request.tenant == "beta"
    await client.close()


async def test_openai_client_with_a_wrong_key(keyed_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=keyed_url, api_key="sk-wrong-0000000000", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        await client.chat.completions.create(
            model="m7b", messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.code == "invalid_api_key"
    await client.close()


def test_keys_never_appear_in_settings_repr() -> None:
    text = repr(keyed_settings()) + str(keyed_settings().model_dump())
    assert ALPHA not in text
    assert BETA not in text


def test_a_key_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        make_settings(api_keys=(ApiKey(key=ALPHA, tenant="a"), ApiKey(key=ALPHA, tenant="b")))
