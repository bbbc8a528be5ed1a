"""Instances that are down: the liveness tracker's verdicts, and a Controller that plans only
onto the instances it has views of (the live loop passes views of live instances only)."""

from __future__ import annotations

import pytest

from qlm.clock import VirtualClock
from qlm.config import QlmConfig
from qlm.control.controller import Controller, InstanceView
from qlm.control.liveness import InstanceLiveness
from qlm.types import Fleet, Request
from tests.factories import make_instance, make_profile, make_request


def test_an_instance_is_up_while_its_reports_keep_changing() -> None:
    live = InstanceLiveness(["a", "b"], timeout_s=2.0, now_s=100.0)
    assert live.update([], 101.0) == {"a", "b"}  # the start counts as heard from
    assert live.update([("a", 5.0)], 101.5) == {"a", "b"}
    assert live.update([("a", 6.0), ("b", 7.0)], 103.0) == {"a", "b"}
    # a keeps reporting; b's report stays the same (its agent died): down 2 s after it was new
    assert live.update([("a", 8.0), ("b", 7.0)], 104.9) == {"a", "b"}
    assert live.update([("a", 9.0), ("b", 7.0)], 105.0) == {"a"}
    assert live.update([("a", 9.5), ("b", 7.5)], 105.1) == {"a", "b"}  # b's agent is back


def test_liveness_ignores_the_agents_clocks() -> None:
    """Reports from an agent whose clock runs an hour behind still count as fresh."""
    live = InstanceLiveness(["a"], timeout_s=1.0, now_s=0.0)
    for k in range(1, 6):
        assert live.update([("a", -3600.0 + k)], float(k)) == {"a"}


def test_an_instance_that_never_reports_is_down_after_the_timeout() -> None:
    live = InstanceLiveness(["a", "b"], timeout_s=1.0, now_s=0.0)
    assert live.update([("a", 1.0)], 0.5) == {"a", "b"}
    assert live.update([("a", 2.0)], 1.0) == {"a"}
    with pytest.raises(ValueError, match="timeout_s"):
        InstanceLiveness([], timeout_s=0.0, now_s=0.0)


def setup() -> Controller:
    fleet = Fleet.of(
        [make_instance("i0", loaded_model="m7b"), make_instance("i1", loaded_model="m7b")],
        [make_profile("m7b")],
    )
    return Controller(QlmConfig(), fleet, VirtualClock(), planner_policy="edf")


def batch(n: int, at_s: float = 0.0) -> list[Request]:
    return [make_request(slo_class="batch-2", ttft_s=3600, arrival_at_s=at_s) for _ in range(n)]


def test_a_replan_places_nothing_on_an_instance_without_a_view() -> None:
    ctl = setup()
    plan = ctl.replan(batch(6), [InstanceView("i1", "m7b", 0.0)], 0.0)
    assert not plan.queues.get("i0")
    assert sorted(plan.queues["i1"]) == sorted(plan.groups)


def test_groups_waiting_on_an_instance_that_went_down_ask_for_a_replan() -> None:
    ctl = setup()
    both = [InstanceView("i0", "m7b", 0.0), InstanceView("i1", "m7b", 5.0)]
    queued = batch(6)
    plan = ctl.replan(queued, both, 0.0)
    assert plan.queues.get("i0"), "the idle instance gets work while it is up"
    assert not ctl.needs_replan(queued, both, 1.0).needed
    only_i1 = [InstanceView("i1", "m7b", 5.0)]
    reason = ctl.needs_replan(queued, only_i1, 1.0)
    assert reason.needed
    moved = ctl.replan(queued, only_i1, 1.0)
    assert not moved.queues.get("i0")
    assert {rid for g in moved.groups.values() for rid in g.request_ids} == {r.id for r in queued}
    assert not ctl.needs_replan(queued, only_i1, 2.0).needed


def test_with_every_instance_down_a_replan_places_nothing() -> None:
    ctl = setup()
    plan = ctl.replan(batch(3), [], 0.0)
    assert not any(plan.queues.values())


def test_an_instance_that_comes_back_gets_work_at_the_next_round() -> None:
    ctl = setup()
    queued = batch(8)
    only_i1 = [InstanceView("i1", "m7b", 0.0)]
    plan = ctl.replan(queued, only_i1, 0.0)
    assert not plan.queues.get("i0")
    both = [InstanceView("i0", "m7b", 0.0), *only_i1]
    reason = ctl.needs_replan(queued, both, 1.0)
    assert reason.needed
    assert "i0" in reason.why
    assert ctl.replan(queued, both, 1.0).queues.get("i0"), "the idle instance is used again"
    assert not ctl.needs_replan(queued, both, 2.0).needed
    assert not ctl.needs_replan([], only_i1, 3.0).needed  # nothing queued: nothing to move
