"""The API over the Redis queue: the same flows as with the embedded queue, through a
throwaway redis-server (marker `redis`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from qlm.api import create_app
from qlm.clock import VirtualClock
from qlm.queue.factory import make_queue
from qlm.queue.queue_protocol import GlobalQueue
from tests.api.conftest import make_settings, serving, wait_until
from tests.api.fake_agent import FakeAgent
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture
async def redis_queue(redis_url: str, redis_key_prefix: str) -> AsyncIterator[GlobalQueue]:
    queue = make_queue(redis_url, key_prefix=redis_key_prefix)
    yield queue
    await queue.close()


@pytest.fixture
async def redis_agent(redis_queue: GlobalQueue, clock: VirtualClock) -> AsyncIterator[FakeAgent]:
    fake = FakeAgent(redis_queue, clock)
    task = asyncio.create_task(fake.run())
    yield fake
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_async_and_streaming_over_redis(
    redis_queue: GlobalQueue, redis_agent: FakeAgent, clock: VirtualClock
) -> None:
    redis_agent.evict_after_tokens = 2
    app = create_app(make_settings(), redis_queue, clock)
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        body = {"kind": "completion", "model": "m7b", "prompt": "x", "max_tokens": 4}
        rid = (await http.post("/v1/qlm/requests", json=body)).json()["id"]

        async def done() -> bool:
            return bool((await http.get(f"/v1/qlm/requests/{rid}")).json()["result"])

        await wait_until(done)
        view = (await http.get(f"/v1/qlm/requests/{rid}")).json()
        assert view["result"]["text"] == "w0 w1 w2 w3 "
        assert view["evictions"] == 1

        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        stream = await client.chat.completions.create(
            model="m7b", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
        )
        pieces = [c.delta.content async for chunk in stream for c in chunk.choices]
        await client.close()
        assert "".join(p for p in pieces if p) == "w0 w1 w2 w3 w4 "
        counts = (await http.get("/v1/qlm/queue")).json()["counts"]
        assert counts["completed"] == 2
        assert (await http.get("/readyz")).status_code == 200


async def test_disconnect_cancels_over_redis(
    redis_queue: GlobalQueue, redis_agent: FakeAgent, clock: VirtualClock
) -> None:
    redis_agent.serving = False
    app = create_app(make_settings(), redis_queue, clock)
    body = {"model": "m7b", "prompt": "x", "stream": True}
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            rid = resp.headers["x-qlm-request-id"]
        # the client left while the API was blocked reading the request's Redis stream

        async def cancelled() -> bool:
            return bool((await http.get(f"/v1/qlm/requests/{rid}")).json()["state"] == "cancelled")

        await wait_until(cancelled)


async def test_redis_down_is_503_with_retry_after_and_nothing_accepted(
    clock: VirtualClock,
) -> None:
    """Past the client's retries, a submission, a lookup and the queue counts answer 503
    `queue_unavailable` with Retry-After (not 500); after Redis returns, work goes on."""
    with RedisServer() as server:
        queue = make_queue(server.url, retries=1, retry_backoff_cap_s=0.05)
        settings = make_settings()
        app = create_app(settings, queue, clock)
        body = {"kind": "completion", "model": "m7b", "prompt": "x", "max_tokens": 4}
        try:
            async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
                rid = (await http.post("/v1/qlm/requests", json=body)).json()["id"]
                server.stop()
                for method, path in [
                    ("POST", "/v1/qlm/requests"),
                    ("GET", f"/v1/qlm/requests/{rid}"),
                    ("GET", "/v1/qlm/queue"),
                ]:
                    resp = await http.request(method, path, json=body if method == "POST" else None)
                    assert resp.status_code == 503, (path, resp.text)
                    assert resp.json()["error"]["code"] == "queue_unavailable"
                    retry = resp.headers["retry-after"]
                    assert retry == str(settings.api.queue_full_retry_after_s)
        finally:
            await queue.close()
