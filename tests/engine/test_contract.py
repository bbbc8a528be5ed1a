"""The EngineClient contract: what every engine (simulated, emulated, later vLLM) must do, as
an agent relies on it. Parametrised over tests/engine/harness.py:ENGINE_FACTORIES."""

from __future__ import annotations

from collections import Counter

import pytest

from qlm.engine.client import EngineClient
from qlm.engine.engine_types import (
    Aborted,
    EngineError,
    EngineEvent,
    EngineState,
    FirstToken,
    ModelLoaded,
    RequestFinished,
    TokenChunk,
)
from tests.engine.harness import HarnessFactory, make_request


def _ended(events: list[EngineEvent]) -> set[str]:
    return {e.request_id for e in events if isinstance(e, RequestFinished | Aborted)}


def _started(events: list[EngineEvent]) -> set[str]:
    return {e.request_id for e in events if isinstance(e, FirstToken)}


def _assert_time_ordered(events: list[EngineEvent]) -> None:
    times = [e.at_s for e in events]
    assert times == sorted(times)


async def test_a_fresh_engine_is_ready_and_empty(engine_factory: HarnessFactory) -> None:
    async with engine_factory() as h:
        assert isinstance(h.engine, EngineClient)
        obs = h.engine.observe()
        assert obs.instance_id == h.engine.instance_id
        assert (obs.state, obs.model, obs.requests) == (EngineState.READY, h.models[0], ())
        assert obs.kv_capacity_tokens > 0
        assert obs.kv_used_tokens == 0
        assert obs.max_num_seqs >= 1


async def test_every_request_starts_once_then_finishes_once(
    engine_factory: HarnessFactory,
) -> None:
    async with engine_factory() as h:
        ids = [f"c{i}" for i in range(8)]
        for rid in ids:
            h.engine.submit(make_request(rid, h.models[0], max_output_tokens=20))
        events = await h.run_until(lambda ev: _ended(ev) >= set(ids))
        assert Counter(e.request_id for e in events if isinstance(e, FirstToken)) == dict.fromkeys(
            ids, 1
        )
        done = {e.request_id: e for e in events if isinstance(e, RequestFinished)}
        assert set(done) == set(ids)
        for rid, fin in done.items():
            assert 1 <= fin.output_tokens <= 20
            assert fin.first_token_at_s <= fin.at_s
            chunks = [e for e in events if isinstance(e, TokenChunk) and e.request_id == rid]
            if chunks:  # engines that stream account for every token
                assert sum(c.num_tokens for c in chunks) == fin.output_tokens
        _assert_time_ordered(events)
        obs = h.engine.observe()
        assert (obs.requests, obs.kv_used_tokens) == ((), 0)


async def test_abort_drops_a_running_request(engine_factory: HarnessFactory) -> None:
    async with engine_factory() as h:
        h.engine.submit(make_request("long", h.models[0], max_output_tokens=100_000))
        await h.run_until(lambda ev: "long" in _started(ev))
        assert [r.request_id for r in h.engine.observe().requests] == ["long"]
        h.engine.abort(["long"])
        events = await h.run_until(lambda ev: "long" in _ended(ev))
        assert [type(e) for e in events if getattr(e, "request_id", "") == "long"][-1] is Aborted
        assert h.engine.observe().requests == ()


async def test_load_model_aborts_everything_then_serves_the_new_model(
    engine_factory: HarnessFactory,
) -> None:
    async with engine_factory() as h:
        old, new = h.models
        h.engine.submit(make_request("old", old, max_output_tokens=100_000))
        await h.run_until(lambda ev: "old" in _started(ev))
        h.engine.load_model(new)
        assert h.engine.observe().state is EngineState.LOADING
        events = await h.run_until(lambda ev: any(isinstance(e, ModelLoaded) for e in ev))
        assert any(isinstance(e, Aborted) and e.request_id == "old" for e in events)
        loaded = [e for e in events if isinstance(e, ModelLoaded)]
        assert [e.model for e in loaded] == [new]
        obs = h.engine.observe()
        assert (obs.state, obs.model, obs.requests) == (EngineState.READY, new, ())
        h.engine.submit(make_request("fresh", new, max_output_tokens=5))
        events = await h.run_until(lambda ev: "fresh" in _ended(ev))
        assert any(isinstance(e, RequestFinished) and e.request_id == "fresh" for e in events)
        _assert_time_ordered(events)


async def test_refusals_are_engine_errors(engine_factory: HarnessFactory) -> None:
    async with engine_factory() as h:
        with pytest.raises(EngineError):
            h.engine.load_model("no-such-model")
        with pytest.raises(EngineError):
            h.engine.submit(make_request("x", h.models[1]))  # not the loaded model
        assert h.engine.observe().state is EngineState.READY


@pytest.mark.parametrize("kv_swap", [True, False])
async def test_kv_swap_pauses_and_resumes_or_is_refused(
    engine_factory: HarnessFactory, kv_swap: bool
) -> None:
    async with engine_factory(kv_swap=kv_swap) as h:
        h.engine.submit(make_request("s", h.models[0], max_output_tokens=300))
        await h.run_until(lambda ev: "s" in _started(ev))
        if not h.engine.observe().supports_kv_swap:
            with pytest.raises(EngineError):
                h.engine.swap_out(["s"])
            return
        h.engine.swap_out(["s"])
        held = h.engine.observe().requests
        assert [(r.request_id, r.kv_on_cpu) for r in held] == [("s", True)]
        paused_at = held[0].output_tokens
        await h.run_until(lambda ev: False, timeout_s=0.5)  # paused: no progress
        assert h.engine.observe().requests[0].output_tokens == paused_at
        assert "s" not in _ended(h.events)
        h.engine.swap_in(["s"])
        events = await h.run_until(lambda ev: "s" in _ended(ev))
        fin = [e for e in events if isinstance(e, RequestFinished) and e.request_id == "s"]
        assert [f.output_tokens for f in fin] == [300]
