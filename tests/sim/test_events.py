"""The event core: ordering key, heap, clock, cancellation, seeded streams."""

from __future__ import annotations

import numpy as np
import pytest

from qlm.clock import VirtualClock
from qlm.sim.events import EventLoop, Priority, RandomStreams, event_key


def test_key_orders_by_time_then_priority_then_sequence() -> None:
    keys = [
        event_key(2.0, Priority.ENGINE, 0),
        event_key(1.0, Priority.SAMPLE, 1),
        event_key(1.0, Priority.ENGINE, 5),
        event_key(1.0, Priority.ENGINE, 2),
        event_key(1.0, Priority.ARRIVAL, 3),
    ]
    assert sorted(keys) == [
        (1.0, Priority.ENGINE, 2),
        (1.0, Priority.ENGINE, 5),
        (1.0, Priority.ARRIVAL, 3),
        (1.0, Priority.SAMPLE, 1),
        (2.0, Priority.ENGINE, 0),
    ]


def test_loop_runs_handlers_in_key_order_and_moves_the_clock() -> None:
    loop = EventLoop()
    seen: list[tuple[str, float]] = []

    def note(tag: str) -> None:
        seen.append((tag, loop.now_s()))

    loop.schedule(3.0, Priority.ARRIVAL, lambda: note("late"))
    loop.schedule(1.0, Priority.TIMER, lambda: note("timer"))
    loop.schedule(1.0, Priority.ENGINE, lambda: note("engine"))
    loop.schedule(1.0, Priority.TIMER, lambda: note("timer2"))
    assert loop.run() == 4
    assert seen == [("engine", 1.0), ("timer", 1.0), ("timer2", 1.0), ("late", 3.0)]
    assert loop.processed == 4


def test_handlers_schedule_more_and_until_stops_before_later_events() -> None:
    loop = EventLoop(VirtualClock(10.0))
    fired: list[float] = []

    def tick() -> None:
        fired.append(loop.now_s())
        loop.schedule(loop.now_s() + 1.0, Priority.TIMER, tick)

    loop.schedule(10.0, Priority.TIMER, tick)
    loop.run(until_s=13.5)
    assert fired == [10.0, 11.0, 12.0, 13.0]
    assert loop.now_s() == 13.0
    assert loop.next_at_s() == 14.0


def test_a_handler_stops_the_run_and_a_new_run_resumes() -> None:
    loop = EventLoop()
    count = [0]

    def bump() -> None:
        count[0] += 1
        if count[0] == 3:
            loop.stop()

    for t in range(10):
        loop.schedule(float(t), Priority.ARRIVAL, bump)
    assert loop.run() == 3
    assert loop.next_at_s() == 3.0
    assert loop.run() == 7
    assert count[0] == 10


def test_cancelled_events_never_run() -> None:
    loop = EventLoop()
    ran: list[str] = []
    key = loop.schedule(1.0, Priority.ENGINE, lambda: ran.append("cancelled"))
    loop.schedule(2.0, Priority.ENGINE, lambda: ran.append("kept"))
    loop.cancel(key)
    assert loop.next_at_s() == 2.0
    assert loop.run() == 1
    assert ran == ["kept"]


def test_scheduling_in_the_past_is_refused() -> None:
    loop = EventLoop(VirtualClock(5.0))
    with pytest.raises(ValueError, match="past"):
        loop.schedule(4.0, Priority.TIMER, lambda: None)
    with pytest.raises(ValueError, match="past"):
        loop.schedule(float("nan"), Priority.TIMER, lambda: None)


def test_streams_depend_on_seed_and_name_only() -> None:
    a = RandomStreams(7)
    first = a.generator("arrivals").random(4)
    b = RandomStreams(7)
    b.generator("lengths").random(100)  # another component drawing first changes nothing
    assert np.array_equal(b.generator("arrivals").random(4), first)
    assert not np.array_equal(RandomStreams(8).generator("arrivals").random(4), first)
    assert not np.array_equal(RandomStreams(7).generator("lengths").random(4), first)


def test_a_component_keeps_one_stream() -> None:
    streams = RandomStreams(1)
    assert streams.generator("x") is streams.generator("x")


def test_integer_seeds_per_component_are_stable_and_distinct() -> None:
    streams = RandomStreams(3)
    assert streams.seed_for("engine/a") == RandomStreams(3).seed_for("engine/a")
    assert streams.seed_for("engine/a") != streams.seed_for("engine/b")
    assert streams.seed_for("engine/a") != RandomStreams(4).seed_for("engine/a")
