"""Parrot's context API on a running NativeEngine (qlm/engine/native/contexts.py), with the
tiny tokenizer model of tests/vllm_fixtures.py: a request generated from a filled context
(and from a child context filled after it) answers what the same whole prompt answers, a
fork shares KV without computing, free gives the KV back, and bad calls are EngineErrors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from qlm.clock import WallClock
from qlm.config.native_config import NativeEngineConfig
from qlm.engine.engine_types import EngineError, EngineEvent, RequestFinished
from qlm.engine.native.contexts import NativeContexts
from qlm.engine.native.native_engine import NativeEngine
from qlm.types import Instance, Request
from tests.vllm_fixtures import tiny_models, vllm_python  # noqa: F401

pytestmark = pytest.mark.timeout(300)
SYSTEM = "the queue model plans request group engine token batch " * 6
QUESTION = " which engine serves the next request group"


def greedy(request_id: str, prompt: str) -> Request:
    """12 tokens, greedy (prompt_tokens is what the text encodes to; 1 is a placeholder)."""
    request = Request(request_id, "tiny-a", 1, 12, "interactive", 0.0, 1e9, prompt=prompt)
    request.sampling.update({"temperature": 0.0, "ignore_eos": True})
    return request


async def answers(engine: NativeEngine, ids: set[str]) -> dict[str, str]:
    done: dict[str, str] = {}
    async with asyncio.timeout(60):
        while set(done) != ids:
            events: list[EngineEvent] = engine.poll()
            done |= {e.request_id: e.text for e in events if isinstance(e, RequestFinished)}
            await asyncio.sleep(0.005)
    return done


async def test_generating_from_contexts_answers_as_the_whole_prompt(
    tiny_models: dict[str, Path],  # noqa: F811
) -> None:
    config = NativeEngineConfig(models={"tiny-a": tiny_models["tiny-a"]}, prefix_caching=False)
    instance = Instance("n0", "cpu", 1, 1 << 30, "tiny-a")
    async with NativeEngine(instance, config, WallClock()) as engine:
        await engine.wait_ready()
        contexts = NativeContexts(engine)
        engine.submit(greedy("whole", SYSTEM + QUESTION))
        engine.submit(greedy("whole-system", SYSTEM))
        expected = await answers(engine, {"whole", "whole-system"})

        used_before = engine.observe().kv_used_tokens
        system_tokens = await contexts.fill("system", SYSTEM)
        assert system_tokens > 40
        asked = await contexts.fill("asked", QUESTION, parent="system")
        assert asked > system_tokens
        assert await contexts.fork("copy", "system") == system_tokens
        held = engine.observe().kv_used_tokens
        assert held >= used_before + asked - 16  # the contexts' KV is in use (16-token blocks)
        contexts.generate("asked", greedy("from-context", ""))
        contexts.generate("copy", greedy("from-copy", ""))
        got = await answers(engine, {"from-context", "from-copy"})
        assert got["from-context"] == expected["whole"]
        assert got["from-copy"] == expected["whole-system"]

        for name in ("asked", "copy", "system"):
            contexts.free(name)
        await asyncio.sleep(0.05)
        with pytest.raises(EngineError, match="no filled context 'system'"):
            engine.context_tokens("system")
        assert engine._loaded is not None
        runner = engine._loaded.runner
        assert not runner.contexts
        assert runner.pool.free_blocks == runner.config.num_blocks
        assert engine.observe().kv_used_tokens == used_before


async def test_bad_context_calls_are_engine_errors(tiny_models: dict[str, Path]) -> None:  # noqa: F811
    config = NativeEngineConfig(models={"tiny-a": tiny_models["tiny-a"]}, kv_cache_gib=0.0001)
    instance = Instance("n0", "cpu", 1, 1 << 30, "tiny-a")
    async with NativeEngine(instance, config, WallClock()) as engine:
        await engine.wait_ready()
        contexts = NativeContexts(engine)
        with pytest.raises(EngineError, match="no filled context 'nobody'"):
            await contexts.fill("child", "text", parent="nobody")
        with pytest.raises(EngineError, match="no filled context 'nobody'"):
            contexts.generate("nobody", greedy("r", "text"))
        with pytest.raises(EngineError, match=r"context big: .*exceed the KV cache"):
            await contexts.fill("big", SYSTEM * 40)
        await contexts.fill("one", "the queue")
        with pytest.raises(EngineError, match="context one: sequence one already exists"):
            await contexts.fill("one", "the queue")
