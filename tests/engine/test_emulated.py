"""EmulatedEngine specifics: streamed placeholder text, time scaling, drawn output lengths.
A VirtualClock stands in for the wall clock so that the tests are exact and fast; the
background task is exercised by the contract suite on the real clock."""

from __future__ import annotations

import asyncio

import pytest

from qlm.clock import VirtualClock
from qlm.engine.emulated import EmulatedEngine
from qlm.engine.engine_types import EngineEvent, FirstToken, RequestFinished, TokenChunk
from tests.engine.helpers import STEP, exact_instance, exact_profile, req


def _emulated(clock: VirtualClock, **kwargs: object) -> EmulatedEngine:
    return EmulatedEngine(exact_instance(100_000), [exact_profile()], clock, **kwargs)  # type: ignore[arg-type]


def _drive(engine: EmulatedEngine, clock: VirtualClock, until_s: float) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    while clock.now_s() < until_s:
        clock.advance_by(0.01)
        events += engine.poll()
    return events


def test_tokens_stream_in_chunks_and_the_finish_carries_the_text() -> None:
    clock = VirtualClock()
    engine = _emulated(clock, output_length="cap")
    engine.submit(req("a", prompt=100, output=100))
    events = _drive(engine, clock, 3.0)
    ttft = 0.0201  # 10 ms + 100 x 0.1 ms + 100 x 1 us
    assert events[0] == FirstToken("a", pytest.approx(ttft))
    assert events[1] == TokenChunk("a", pytest.approx(ttft), " tok", 1)
    chunks = [e for e in events if isinstance(e, TokenChunk)]
    assert sum(c.num_tokens for c in chunks) == 100
    assert all(c.text == " tok" * c.num_tokens for c in chunks)
    decode_s = sum(STEP.decode_step_s(1, 100 + k) for k in range(1, 100))  # ~1.1 s
    assert abs(len(chunks) - decode_s / 0.05) <= 3  # one chunk per 50 ms of engine time
    done = events[-1]
    assert isinstance(done, RequestFinished)
    assert done.at_s == pytest.approx(ttft + decode_s)
    assert done.text == " tok" * 100


def test_speedup_compresses_time_onto_the_clock() -> None:
    clock = VirtualClock(start_s=1000.0)
    engine = _emulated(clock, speedup=10.0, output_length="cap")
    engine.submit(req("a", prompt=100, output=3))
    events = _drive(engine, clock, 1001.0)
    first = next(e for e in events if isinstance(e, FirstToken))
    done = next(e for e in events if isinstance(e, RequestFinished))
    assert first.at_s == pytest.approx(1000.0 + 0.0201 / 10)
    assert done.at_s == pytest.approx(1000.0 + (0.0201 + 0.011101 + 0.011102) / 10)
    assert done.first_token_at_s == pytest.approx(first.at_s)
    assert engine.observe().at_s == pytest.approx(clock.now_s())


def test_drawn_output_lengths_are_seeded_and_capped() -> None:
    lengths = []
    for _ in range(2):
        clock = VirtualClock()
        engine = _emulated(clock, seed=3)  # output_length="profile" (mean 100, std 50)
        for i in range(30):
            engine.submit(req(f"r{i}", prompt=10, output=150))
        events = _drive(engine, clock, 60.0)
        lengths.append(
            {e.request_id: e.output_tokens for e in events if isinstance(e, RequestFinished)}
        )
    assert lengths[0] == lengths[1]
    assert len(lengths[0]) == 30
    assert max(lengths[0].values()) <= 150
    assert len(set(lengths[0].values())) > 10


async def test_the_background_task_starts_and_stops() -> None:
    clock = VirtualClock()
    engine = _emulated(clock, output_length="cap")
    await engine.start()
    await engine.start()  # idempotent
    engine.submit(req("a", prompt=10, output=5))
    await asyncio.sleep(0.01)
    clock.advance_by(1.0)
    await engine.close()
    assert any(isinstance(e, RequestFinished) for e in engine.poll())
    await engine.close()  # idempotent
