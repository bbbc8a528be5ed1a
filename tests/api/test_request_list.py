"""GET /v1/qlm/requests: the caller's own requests, newest first, filtered by state, in pages
linked by `next_cursor`; a bad query parameter is a 400 naming it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from qlm.api import create_app
from qlm.clock import VirtualClock
from qlm.config.api_settings import ApiKey
from qlm.queue.memory import MemoryQueue
from tests.api.conftest import NOW_S, make_settings

pytestmark = pytest.mark.timeout(60)
REQUESTS = "/v1/qlm/requests"
KEYS = {"alpha": "sk-alpha-0123456789", "beta": "sk-beta-9876543210"}
AS = {tenant: {"authorization": f"Bearer {key}"} for tenant, key in KEYS.items()}


@pytest.fixture
async def keyed() -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(api_keys=tuple(ApiKey(key=k, tenant=t) for t, k in KEYS.items()))
    app = create_app(settings, MemoryQueue(), VirtualClock(NOW_S))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        yield c


async def submit(client: httpx.AsyncClient, tenant: str, count: int) -> list[str]:
    body = {"kind": "completion", "model": "m7b", "prompt": "hi", "max_tokens": 2}
    ids = []
    for _ in range(count):
        resp = await client.post(REQUESTS, json=body, headers=AS[tenant])
        assert resp.status_code == 202, resp.text
        ids.append(resp.json()["id"])
    return ids


async def listing(client: httpx.AsyncClient, tenant: str, **query: Any) -> dict[str, Any]:
    resp = await client.get(REQUESTS, params=query, headers=AS[tenant])
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


async def test_each_tenant_pages_through_its_own(keyed: httpx.AsyncClient) -> None:
    alpha = await submit(keyed, "alpha", 3)
    beta = await submit(keyed, "beta", 1)
    alpha += await submit(keyed, "alpha", 1)
    first = await listing(keyed, "alpha", limit=3)
    assert [r["id"] for r in first["data"]] == alpha[:0:-1]
    assert (first["object"], first["has_more"]) == ("list", True)
    assert first["data"][0]["estimate_basis"] == "no-plan"  # the record view, whole
    rest = await listing(keyed, "alpha", limit=3, after=first["next_cursor"])
    assert ([r["id"] for r in rest["data"]], rest["has_more"]) == ([alpha[0]], False)
    assert rest["next_cursor"] is None
    assert [r["id"] for r in (await listing(keyed, "beta"))["data"]] == beta


async def test_state_filter(keyed: httpx.AsyncClient) -> None:
    ids = await submit(keyed, "alpha", 3)
    cancelled = await keyed.delete(f"{REQUESTS}/{ids[1]}", headers=AS["alpha"])
    assert cancelled.status_code == 200
    only = await listing(keyed, "alpha", state="cancelled")
    assert [r["id"] for r in only["data"]] == [ids[1]]
    both = await listing(keyed, "alpha", state="queued,cancelled")
    assert [r["id"] for r in both["data"]] == ids[::-1]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"state": "done"}, "state"),
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"after": "req-0123"}, "after"),
        ({"order": "asc"}, "order"),
    ],
)
async def test_bad_query_parameters_are_named(
    keyed: httpx.AsyncClient, query: dict[str, str], param: str
) -> None:
    resp = await keyed.get(REQUESTS, params=query, headers=AS["alpha"])
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


async def test_listing_needs_a_key(keyed: httpx.AsyncClient) -> None:
    assert (await keyed.get(REQUESTS)).status_code == 401


async def test_without_authentication_every_request_is_listed(client: httpx.AsyncClient) -> None:
    body = {"kind": "completion", "model": "m7b", "prompt": "hi", "max_tokens": 2}
    ids = [(await client.post(REQUESTS, json={**body, "user": u})).json()["id"] for u in "xy"]
    assert [r["id"] for r in (await client.get(REQUESTS)).json()["data"]] == ids[::-1]
