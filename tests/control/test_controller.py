"""The control loop's pure step: full re-plans, incremental inserts, the violation check."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qlm.clock import VirtualClock
from qlm.config import QlmConfig
from qlm.control.controller import Controller, InstanceView
from qlm.solver import Plan, PlanInput
from qlm.types import Fleet
from tests.factories import make_instance, make_profile, make_request


def setup(planner: str = "edf") -> tuple[Controller, Fleet]:
    fleet = Fleet.of(
        [make_instance("i0", loaded_model="m7b"), make_instance("i1", loaded_model="m13b")],
        [make_profile("m7b"), make_profile("m13b", weight_gib=26.0)],
    )
    return Controller(QlmConfig(), fleet, VirtualClock(), planner_policy=planner), fleet


def views(**busy: float) -> list[InstanceView]:
    return [
        InstanceView("i0", "m7b", busy.get("i0", 0.0)),
        InstanceView("i1", "m13b", busy.get("i1", 0.0)),
    ]


def test_replan_covers_every_queued_request_once_and_epochs_grow() -> None:
    ctl, _ = setup()
    queued = [make_request(model=m, slo_class="batch-2", ttft_s=3600) for m in ["m7b", "m13b"] * 5]
    first = ctl.replan(queued, views(), 0.0)
    members = [rid for g in first.groups.values() for rid in g.request_ids]
    assert sorted(members) == sorted(r.id for r in queued)
    placed = [g for q in first.queues.values() for g in q]
    assert sorted(placed) == sorted(first.groups)
    for inst, gids in first.queues.items():
        models = {first.groups[g].model for g in gids}
        assert models <= {"m7b", "m13b"}
        assert inst in {"i0", "i1"}
    assert set(first.forecast.predicted_wait_s) == {r.id for r in queued}
    assert all(w >= 0 for w in first.forecast.predicted_wait_s.values())
    second = ctl.replan(queued, views(), 1.0)
    assert second.epoch == first.epoch + 1


def test_each_planned_group_gets_a_completion_after_its_first_tokens() -> None:
    """The API's completion estimate: a group's last member ends after every member's first
    token (its own output takes time), queues end later than they start, and the number
    survives the cut agents read and the JSON the queue stores."""
    from qlm.agents.virtual_queue import cut_for_agents
    from qlm.control.plan import PublishedPlan

    ctl, _ = setup()
    queued = [make_request(model="m7b", slo_class="batch-2", ttft_s=3600) for _ in range(40)]
    plan = ctl.replan(queued, views(i0=5.0), 0.0)
    assert set(plan.forecast.group_done_s) == {g for q in plan.queues.values() for g in q}
    for group_ids in plan.queues.values():
        ends = [plan.forecast.group_done_s[g] for g in group_ids]
        for gid in group_ids:
            firsts = [plan.forecast.predicted_wait_s[r] for r in plan.groups[gid].request_ids]
            assert plan.forecast.group_done_s[gid] > max(firsts) >= 5.0  # behind the busy engine
        assert ends == sorted(ends)
    assert set(plan.forecast.group_step_s) == set(plan.forecast.group_done_s)
    assert all(step_s > 0 for step_s in plan.forecast.group_step_s.values())
    cut = cut_for_agents(plan, {r.id for r in queued}, members=3)
    assert (cut.forecast.group_done_s, cut.forecast.group_step_s) == (
        plan.forecast.group_done_s,
        plan.forecast.group_step_s,
    )
    stored = PublishedPlan.from_json(cut.to_json())
    assert (stored.forecast.group_done_s, stored.forecast.group_step_s) == (
        plan.forecast.group_done_s,
        plan.forecast.group_step_s,
    )


def test_a_lone_request_is_priced_on_the_fastest_live_instance_for_its_model() -> None:
    """PublishedPlan.forecast.lone (the API's `idle` estimate): per model, the profile of the live
    instance with the shortest batch-1 step, preferring one that holds the model (else its
    load time counts); an instance that is down, or that the model does not fit, does not."""
    from qlm.control.controller import lone_speeds
    from qlm.control.plan import LoneSpeed, PublishedPlan

    profiles = [
        make_profile("m7b", "A10", step_s=(0.05, 0.06, 0.08), prefill_tokens_per_s=2000.0),
        make_profile("m7b", "H100", step_s=(0.01, 0.02, 0.03), prefill_tokens_per_s=30000.0),
        make_profile("m13b", "A10", output_mean=80.0),
    ]
    a10, h100 = make_instance("a", "A10"), make_instance("h", "H100")
    fleet = Fleet.of([a10, h100], profiles)
    fast = LoneSpeed(prefill_tokens_per_s=30000.0, decode_step_s=0.01, output_tokens_mean=200.0)
    must_load = LoneSpeed(10_000.0, 0.02, 80.0, load_s=10.0)  # both hold m7b
    assert lone_speeds(fleet) == {"m7b": fast, "m13b": must_load}
    assert must_load.first_token_s(100) == pytest.approx(10.01)  # load, then prefill
    assert lone_speeds(Fleet.of([a10], profiles))["m7b"].decode_step_s == 0.05
    holding = lone_speeds(Fleet.of([a10, replace(h100, loaded_model=None)], profiles))
    assert holding["m7b"].decode_step_s == 0.05  # the slower A10 holds it: no load
    small = make_instance("s", "A10", memory_gib=8.0, loaded_model=None)  # 14 GiB of weights
    assert lone_speeds(Fleet.of([small], profiles)) == {}
    ctl = Controller(QlmConfig(), fleet, VirtualClock(), planner_policy="edf")
    views = [InstanceView("a", "m7b", 0.0)]  # the H100 is down
    plan = ctl.replan([make_request(model="m7b")], views, 0.0)
    assert plan.forecast.lone["m7b"].decode_step_s == 0.05
    assert PublishedPlan.from_json(plan.to_json()).forecast.lone == plan.forecast.lone


def test_arrival_joins_a_planned_group_without_solving() -> None:
    ctl, _ = setup()
    queued = [make_request(slo_class="batch-2", ttft_s=3600) for _ in range(4)]
    plan = ctl.replan(queued, views(), 0.0)
    late = make_request(slo_class="batch-2", ttft_s=3600, arrival_at_s=1.0)
    updated = ctl.on_arrival(late, 1.0)
    assert updated is not None
    assert updated.epoch == plan.epoch + 1
    assert updated.group_of(late.id) is not None
    assert updated.queues == plan.queues
    assert (updated.created_at_s, updated.forecast.waits_at_s) == (
        1.0,
        0.0,
    )  # the waits are the re-plan's
    assert not ctl.needs_replan([*queued, late], views(), 1.0).needed


def test_arrival_of_an_unplanned_model_asks_for_a_replan() -> None:
    ctl, _ = setup()
    ctl.replan([make_request(model="m7b")], views(), 0.0)
    assert ctl.on_arrival(make_request(model="m13b"), 0.5) is None


def test_no_plan_means_replan_when_anything_is_queued() -> None:
    ctl, _ = setup()
    assert not ctl.needs_replan([], views(), 0.0).needed
    assert ctl.needs_replan([make_request()], views(), 0.0).needed


def test_violation_check_fires_when_an_instance_falls_behind() -> None:
    ctl, _ = setup()
    queued = [make_request(ttft_s=20.0) for _ in range(8)]
    ctl.replan(queued, views(), 0.0)
    assert not ctl.needs_replan(queued, views(), 0.0).needed
    # The same queue, but i0 now has 100 s of work ahead of it: the groups become late.
    reason = ctl.needs_replan(queued, views(i0=100.0), 0.0)
    assert reason.needed
    assert "late" in reason.why


def test_groups_already_late_at_plan_time_do_not_retrigger() -> None:
    ctl, _ = setup()
    queued = [make_request(ttft_s=1.0) for _ in range(200)]
    plan = ctl.replan(queued, views(i0=50.0), 0.0)
    assert ctl.last_solve is not None
    assert ctl.last_solve.late_groups
    assert not ctl.needs_replan(queued, views(i0=50.0), 0.0).needed
    assert plan.status == "heuristic"


def small_groups_controller() -> Controller:
    fleet = Fleet.of([make_instance("i0", loaded_model="m7b")], [make_profile("m7b")])
    config = QlmConfig.model_validate({"grouping": {"avg_batch_size": 1, "delta": 2}})
    return Controller(config, fleet, VirtualClock(), planner_policy="edf")


def test_arrivals_join_a_placed_part_of_their_cluster_when_grouping_splits() -> None:
    ctl = small_groups_controller()
    queued = [make_request(slo_class="batch-2", ttft_s=3600) for _ in range(4)]
    ctl.replan(queued, [InstanceView("i0", "m7b")], 0.0)
    arrivals = [make_request(slo_class="batch-2", ttft_s=3600, arrival_at_s=1.0) for _ in range(6)]
    for r in arrivals:
        assert ctl.on_arrival(r, 1.0) is not None  # no re-plan for a split part
    plan = ctl.plan
    assert plan is not None
    assert all(plan.group_of(r.id) in plan.queues["i0"] for r in arrivals)
    assert not ctl.needs_replan([*queued, *arrivals], [InstanceView("i0", "m7b")], 1.0).needed


def test_dequeued_requests_leave_grouping() -> None:
    ctl = small_groups_controller()
    queued = [make_request(slo_class="batch-2", ttft_s=3600) for _ in range(4)]
    ctl.replan(queued, [InstanceView("i0", "m7b")], 0.0)
    ctl.forget_dequeued(queued[2:])  # two were pulled
    members = sum(g.size for g in ctl._grouping.groups())
    assert members == 2
    assert not ctl.holds(queued[0].id)
    assert ctl.holds(queued[2].id)
    # A pulled request that comes back (evicted) is outside the plan: re-plan.
    assert ctl.needs_replan(queued, [InstanceView("i0", "m7b")], 2.0).needed


def test_a_replan_tells_the_planner_how_many_requests_arrived_since_the_last() -> None:
    # The solver's budget grows with them (PlannerConfig.search_s_per_request): a request
    # that joined a planned group between re-plans counts, as does one that fit none.
    ctl, _ = setup("milp")
    seen: list[int | None] = []
    planner = ctl._planner
    solve = planner.plan

    def spy(inp: PlanInput) -> Plan:
        seen.append(inp.new_requests)
        return solve(inp)

    planner.plan = spy  # type: ignore[method-assign]
    queued = [make_request(slo_class="batch-2", ttft_s=3600) for _ in range(4)]
    ctl.replan(queued, views(), 0.0)
    joined = make_request(slo_class="batch-2", ttft_s=3600, arrival_at_s=1.0)
    assert ctl.on_arrival(joined, 1.0) is not None
    other = make_request(model="m13b", arrival_at_s=1.5)
    assert ctl.on_arrival(other, 1.5) is None
    ctl.replan([*queued[1:], joined, other], views(), 2.0)  # queued[0] was served meanwhile
    assert seen == [4, 2]
