"""Fixtures for the API: settings with two models, an in-memory queue, a virtual clock, the
app behind an in-process client or a real uvicorn server, and a fake agent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from qlm.api import ApiAppConfig, ApiConfig, ModelConfig, create_app
from qlm.api.program_runner import ProgramRunner
from qlm.clock import VirtualClock
from qlm.config import SloClassConfig
from qlm.queue.memory import MemoryQueue
from tests.api.fake_agent import FakeAgent

NOW_S = 1_000.0
CLASSES = (
    SloClassConfig(name="interactive", ttft_s=20.0, lateness_weight=100.0, priority=2),
    SloClassConfig(name="batch-1", ttft_s=60.0, lateness_weight=10.0, priority=1),
    SloClassConfig(name="batch-2", ttft_s=3600.0, completion_s=7200.0, priority=0),
)


def make_settings(**overrides: object) -> ApiAppConfig:
    """Two models and the test classes; an override of an ApiConfig field goes to `api`."""
    values: dict[str, object] = {
        "models": (
            ModelConfig(name="m7b", max_context_tokens=4096),
            ModelConfig(name="m13b", max_context_tokens=2048, max_output_tokens=512),
        ),
        "slo_classes": CLASSES,
        "default_slo_class": "interactive",
    }
    api: dict[str, object] = {
        "max_body_bytes": 64 * 1024,
        "completion_timeout_s": 10.0,
        "default_max_tokens": 64,
    }
    for name, value in overrides.items():
        (api if name in ApiConfig.model_fields else values)[name] = value
    return ApiAppConfig.model_validate({**values, "api": api})


@pytest.fixture
def settings() -> ApiAppConfig:
    return make_settings()


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(NOW_S)


@pytest.fixture
async def queue() -> AsyncIterator[MemoryQueue]:
    queue = MemoryQueue()
    yield queue
    await queue.close()


@pytest.fixture
def app(settings: ApiAppConfig, queue: MemoryQueue, clock: VirtualClock) -> FastAPI:
    return create_app(settings, queue, clock)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client


@pytest.fixture
async def agent(queue: MemoryQueue, clock: VirtualClock) -> AsyncIterator[FakeAgent]:
    """A running fake agent; tests flip its switches."""
    fake = FakeAgent(queue, clock)
    task = asyncio.create_task(fake.run())
    yield fake
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """A uvicorn server for `app` on a free port, in this event loop; yields its base URL."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def base_url(app: FastAPI) -> AsyncIterator[str]:
    async with serving(app) as url:
        yield url


async def wait_until(predicate: Callable[[], object], timeout_s: float = 5.0) -> None:
    """Poll an async-free predicate or a coroutine function until it is truthy."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


@pytest.fixture
async def runner(app: FastAPI) -> AsyncIterator[ProgramRunner]:
    """The app's program runner, running (its rounds) for the test."""
    program_runner: ProgramRunner = app.state.program_runner
    stop = asyncio.Event()
    task = asyncio.create_task(program_runner.run(stop))
    yield program_runner
    stop.set()
    with contextlib.suppress(asyncio.CancelledError):
        await task
