"""SimulatedEngine specifics: the simulator's loop (next_event_at_s, advance, poll) on a
virtual clock reproduces the engine model's times, and the output-length option applies."""

from __future__ import annotations

import pytest

from qlm.clock import VirtualClock
from qlm.engine.engine_types import EngineEvent, RequestFinished
from qlm.engine.model.core import EngineModel
from qlm.engine.simulated import SimulatedEngine
from tests.engine.helpers import exact_instance, exact_profile, req


def _loop(engine: SimulatedEngine, clock: VirtualClock) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    while (at := engine.next_event_at_s()) is not None:
        clock.advance_to(at)
        engine.advance_to(at)
        events += engine.poll()
    return events


def test_the_simulator_loop_gives_the_model_s_times() -> None:
    clock = VirtualClock()
    engine = SimulatedEngine(exact_instance(10_000), [exact_profile()], clock)
    model = EngineModel(exact_instance(10_000), [exact_profile()])
    for i in range(20):
        engine.submit(req(f"r{i}", prompt=100 + 10 * i, output=5 + i))
        model.add(req(f"r{i}", prompt=100 + 10 * i, output=5 + i), 0.0)
    events = _loop(engine, clock)
    assert events == model.advance_to(1e9)
    assert engine.stats == model.stats
    assert engine.next_event_at_s() is None
    assert clock.now_s() == pytest.approx(max(e.at_s for e in events))


def test_submissions_act_at_the_clock_s_time() -> None:
    clock = VirtualClock(start_s=50.0)
    engine = SimulatedEngine(exact_instance(10_000), [exact_profile()], clock)
    engine.submit(req("a", prompt=100, output=1))
    done = [e for e in _loop(engine, clock) if isinstance(e, RequestFinished)]
    assert [d.at_s for d in done] == [pytest.approx(50.0 + 0.0201)]


def test_output_lengths_can_be_drawn_from_the_profile() -> None:
    clock = VirtualClock()
    engine = SimulatedEngine(
        exact_instance(100_000), [exact_profile()], clock, output_length="profile", seed=1
    )
    for i in range(40):
        engine.submit(req(f"r{i}", prompt=10, output=1000))
    lengths = [e.output_tokens for e in _loop(engine, clock) if isinstance(e, RequestFinished)]
    assert len(lengths) == 40
    assert 60 < sum(lengths) / 40 < 140  # profile mean 100
    assert len(set(lengths)) > 20
