"""No API key and no prompt text reaches the logs by default: every log record of a served
session (uvicorn with its access log, the API, the queue, at DEBUG) is checked, for requests
that succeed, stream, fail validation, fail authentication or fail in the engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn

from qlm.api import create_app
from qlm.clock import VirtualClock
from qlm.config.api_settings import ApiKey
from qlm.queue.memory import MemoryQueue
from qlm.queue.records import RequestResult
from qlm.types import RequestState
from tests.api.conftest import NOW_S, make_settings, wait_until
from tests.api.fake_agent import FakeAgent

pytestmark = pytest.mark.timeout(60)
KEY = "sk-logcheck-a1b2c3d4e5"
WRONG_KEY = "sk-wrongkey-z9y8x7w6v5"
PROMPT = "PROMPT-TEXT-that-must-not-be-logged-7f3a"


@contextlib.asynccontextmanager
async def chatty_server(queue: MemoryQueue, clock: VirtualClock) -> AsyncIterator[str]:
    """The app behind uvicorn with its access log on and logging left to the root logger."""
    app = create_app(make_settings(api_keys=(ApiKey(key=KEY, tenant="t"),)), queue, clock)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="debug", access_log=True, log_config=None
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


async def test_no_key_or_prompt_in_any_log_record(
    caplog: pytest.LogCaptureFixture, queue: MemoryQueue, clock: VirtualClock
) -> None:
    caplog.set_level(logging.DEBUG)
    agent = FakeAgent(queue, clock)
    agent_task = asyncio.create_task(agent.run())
    auth = {"authorization": f"Bearer {KEY}"}
    chat = {"model": "m7b", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3}
    async with chatty_server(queue, clock) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await client.post("/v1/chat/completions", json=chat, headers=auth)).is_success
        streamed = await client.post(
            "/v1/chat/completions", json={**chat, "stream": True}, headers=auth
        )
        assert streamed.is_success
        bad = await client.post(
            "/v1/chat/completions", json={**chat, "max_tokens": 0}, headers=auth
        )
        assert bad.status_code == 400
        wrong = {"authorization": f"Bearer {WRONG_KEY}"}
        assert (
            await client.post("/v1/chat/completions", json=chat, headers=wrong)
        ).status_code == 401
        agent.serving = False
        submitted = await client.post(
            "/v1/qlm/requests", json={**chat, "kind": "chat"}, headers=auth
        )
        rid = submitted.json()["id"]
        failed = RequestResult(
            rid, RequestState.FAILED, None, error="engine down", finished_at_s=NOW_S
        )
        assert await queue.complete(failed)
        await wait_until(lambda: queue.get(rid))
        assert (await client.get(f"/v1/qlm/requests/{rid}", headers=auth)).status_code == 200
    agent_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await agent_task
    assert any(r.name == "uvicorn.access" for r in caplog.records)  # the capture works
    for record in caplog.records:
        trace = logging.Formatter().formatException(record.exc_info) if record.exc_info else ""
        text = record.getMessage() + trace
        for secret in (KEY, WRONG_KEY, PROMPT):
            assert secret not in text, f"{record.name}: {text[:200]}"
