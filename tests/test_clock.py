"""Injected time: virtual time moves only when told to; wall time moves on its own."""

from __future__ import annotations

import time

import pytest

from qlm.clock import VirtualClock, WallClock


@pytest.mark.parametrize(
    ("start_s", "steps", "expected_s"),
    [
        (0.0, [], 0.0),  # starts where it is told
        (5.0, [], 5.0),
        (0.0, [("to", 10.0)], 10.0),  # jump to an absolute time
        (0.0, [("by", 2.5), ("by", 2.5)], 5.0),  # relative steps add up
        (1.0, [("to", 4.0), ("by", 0.5)], 4.5),  # 4.0 then +0.5
        (3.0, [("to", 3.0)], 3.0),  # advancing to now is allowed (events at the same time)
        (3.0, [("by", 0.0)], 3.0),  # a zero step is allowed
    ],
)
def test_virtual_clock_advances(
    start_s: float, steps: list[tuple[str, float]], expected_s: float
) -> None:
    clock = VirtualClock(start_s)
    for kind, value in steps:
        if kind == "to":
            clock.advance_to(value)
        else:
            clock.advance_by(value)
    assert clock.now_s() == expected_s
    # Virtual time has one timeline: monotonic and now agree.
    assert clock.monotonic_s() == expected_s


@pytest.mark.parametrize(
    ("move", "value"),
    [
        ("to", 9.999),  # just before now (10.0)
        ("to", 0.0),
        ("by", -0.001),  # a negative step
    ],
)
def test_virtual_clock_cannot_go_backwards(move: str, value: float) -> None:
    clock = VirtualClock(10.0)
    advance = clock.advance_to if move == "to" else clock.advance_by
    with pytest.raises(ValueError, match="cannot go back"):
        advance(value)
    assert clock.now_s() == 10.0  # the refused move left time unchanged


def test_virtual_clock_does_not_move_by_itself() -> None:
    clock = VirtualClock(7.0)
    time.sleep(0.01)
    assert clock.now_s() == 7.0  # real time passed; virtual time did not


def test_wall_clock_monotonic_increases() -> None:
    clock = WallClock()
    first = clock.monotonic_s()
    time.sleep(0.01)
    second = clock.monotonic_s()
    # At least the 10 ms slept (minus timer granularity), and forwards.
    assert second - first >= 0.009


def test_wall_clock_now_is_epoch_time() -> None:
    before = time.time()
    now = WallClock().now_s()
    after = time.time()
    assert before <= now <= after  # seconds since the epoch, read from the system clock
