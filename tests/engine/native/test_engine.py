"""NativeEngine (qlm/engine/native/native_engine.py) beyond the contract suite: a request
aborted and sent again with the same id while a step runs, and an engine that fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from qlm.clock import WallClock
from qlm.config.native_config import NativeEngineConfig
from qlm.engine.engine_types import (
    Aborted,
    EngineError,
    EngineEvent,
    EngineFailed,
    EngineState,
    FirstToken,
    RequestFinished,
)
from qlm.engine.native.native_engine import NativeEngine
from qlm.types import Instance, Request
from tests.engine.native.helpers import write_checkpoint

INSTANCE = Instance("n0", "cpu", 1, 1 << 30, "m")


def request(request_id: str, max_tokens: int) -> Request:
    return Request(request_id, "m", 30, max_tokens, "interactive", 0.0, 1e9)


async def until(engine: NativeEngine, events: list[EngineEvent], done: type, rid: str) -> None:
    async with asyncio.timeout(60):
        while not any(isinstance(e, done) and getattr(e, "request_id", rid) == rid for e in events):
            events += engine.poll()
            await asyncio.sleep(0.002)


async def test_an_id_sent_again_after_an_abort_gets_only_its_own_tokens(tmp_path: Path) -> None:
    config = NativeEngineConfig(models={"m": write_checkpoint(tmp_path / "m")}, kv_cache_gib=0.01)
    async with NativeEngine(INSTANCE, config, WallClock()) as engine:
        await engine.wait_ready()
        events: list[EngineEvent] = []
        engine.submit(request("r", 1500))
        await until(engine, events, FirstToken, "r")
        engine.abort(["r"])  # a step is running: the old sequence's tokens still come back
        engine.submit(request("r", 5))
        after = len(events)
        await until(engine, events, RequestFinished, "r")
        mine = [e for e in events[after:] if getattr(e, "request_id", "") == "r"]
        assert [type(e) for e in mine if not isinstance(e, Aborted)].count(FirstToken) == 1
        finished = [e for e in mine if isinstance(e, RequestFinished)]
        assert [e.output_tokens for e in finished] == [5]
        await asyncio.sleep(0.05)
        obs = engine.observe()
        assert (obs.requests, obs.kv_used_tokens) == ((), 0)  # no hidden sequence left


async def test_a_model_that_fails_to_load_fails_the_engine(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    models = {"m": write_checkpoint(tmp_path / "m"), "broken": broken}
    config = NativeEngineConfig(models=models, kv_cache_gib=0.01)
    async with NativeEngine(INSTANCE, config, WallClock()) as engine:
        await engine.wait_ready()
        engine.submit(request("held", 100_000))
        engine.load_model("broken")
        events: list[EngineEvent] = []
        async with asyncio.timeout(60):
            while not any(isinstance(e, EngineFailed) for e in events):
                events += engine.poll()
                await asyncio.sleep(0.01)
        failed = [e for e in events if isinstance(e, EngineFailed)]
        assert "config.json" in failed[0].reason
        assert any(isinstance(e, Aborted) and e.request_id == "held" for e in events)
        assert engine.observe().state is EngineState.FAILED
        with pytest.raises(EngineError, match="failed"):
            engine.submit(request("late", 5))


def test_an_instance_starting_with_an_unknown_model_is_refused(tmp_path: Path) -> None:
    config = NativeEngineConfig(models={"other": write_checkpoint(tmp_path / "o")})
    with pytest.raises(EngineError, match="starts with 'm'"):
        NativeEngine(INSTANCE, config, WallClock())
