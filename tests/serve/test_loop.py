"""The live loop publishes plans pruned to what is still queued, heads only, and annotates
only what changed."""

from __future__ import annotations

import asyncio

import pytest

from qlm.agents.virtual_queue import cut_for_agents
from qlm.clock import VirtualClock
from qlm.config import ControlConfig, QlmConfig
from qlm.config.serve_config import ControllerConfig
from qlm.control.plan import AgentNotes, PlanForecast, PlannedGroup, PublishedPlan
from qlm.queue.memory import MemoryQueue
from qlm.serve.loop import ControlLoop
from qlm.types import Fleet
from tests.factories import make_instance, make_profile, make_request


def _plan() -> PublishedPlan:
    group = PlannedGroup(
        "g", "m7b", "batch-2", ("a", "b", "c"), (1, 2, 3), (4, 5, 6), ("x", "y", "z")
    )
    return PublishedPlan(
        1, 0.0, {"i0": ("g",)}, {"g": group}, forecast=PlanForecast({"a": 1.0, "b": 2.0})
    )


def test_published_plan_drops_members_that_left_the_queue() -> None:
    plan = _plan()
    pruned = cut_for_agents(plan, {"c", "a"}, members=10)
    kept = pruned.groups["g"]
    assert kept.request_ids == ("a", "c")
    assert kept.prompt_tokens == (1, 3)
    assert kept.max_output_tokens == (4, 6)
    assert kept.slo_classes == ("x", "z")
    assert pruned.queues == plan.queues
    assert dict(pruned.forecast.predicted_wait_s) == {"a": 1.0}


def test_published_plan_keeps_only_the_head_of_each_virtual_queue() -> None:
    g1 = PlannedGroup("g1", "m7b", "interactive", ("a", "b"), (1, 2), (3, 4), ("x", "y"))
    g2 = PlannedGroup("g2", "m7b", "batch-2", ("c", "d"), (5, 6), (7, 8), ("z", "z"))
    g3 = PlannedGroup("g3", "m7b", "batch-2", ("e",), (9,), (1,), ("z",))
    waits = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0, "e": 5.0}
    groups = {"g1": g1, "g2": g2, "g3": g3}
    queues = {"i0": ("g1", "g2", "g3"), "i1": ()}
    plan = PublishedPlan(1, 0.0, queues, groups, forecast=PlanForecast(waits))
    pruned = cut_for_agents(plan, set("abcde"), members=3)
    assert pruned.queues == plan.queues
    assert pruned.groups["g1"] == g1
    assert pruned.groups["g2"].request_ids == ("c",)
    assert pruned.groups["g2"].prompt_tokens == (5,)
    assert pruned.groups["g3"].request_ids == ()  # past the head: listed, empty
    assert dict(pruned.forecast.predicted_wait_s) == {"a": 1.0, "b": 2.0, "c": 3.0}
    # each group's last member's wait survives the cut (the API's SLO gate reads it)
    assert dict(pruned.forecast.group_wait_s) == {"g1": 2.0, "g2": 4.0, "g3": 5.0}
    again = PublishedPlan.from_json(pruned.to_json())
    assert dict(again.forecast.group_wait_s) == dict(pruned.forecast.group_wait_s)


def _loop(
    queue: MemoryQueue, clock: VirtualClock, interval_s: float, members: int = 512
) -> ControlLoop:
    control = ControlConfig(
        min_replan_interval_s=interval_s, published_members_per_instance=members, tick_s=1.0
    )
    fleet = Fleet.of([make_instance("i0")], [make_profile("m7b"), make_profile("m13b")])
    return ControlLoop(QlmConfig(control=control), fleet, queue, clock, ControllerConfig())


def test_second_round_annotates_only_new_members() -> None:
    async def run() -> tuple[int, int]:
        clock = VirtualClock(100.0)
        queue = MemoryQueue(clock=clock)
        loop = _loop(queue, clock, interval_s=60.0)
        for i in range(20):
            await queue.enqueue(make_request(id=f"r{i}", arrival_at_s=100.0))
        await loop.step()
        first = len(loop._annotated)
        await queue.enqueue(make_request(id="late", arrival_at_s=100.0))
        plan = loop.controller.plan
        assert plan is not None
        changed, _ = loop._changed_annotations(plan)
        return first, sum(len(g.request_ids) for g in changed.groups.values())

    first, changed_after = asyncio.run(run())
    assert first == 20
    assert changed_after == 0  # nothing moved since the last round's annotation


def test_replans_are_rate_limited_once_a_plan_exists() -> None:
    async def run() -> list[int]:
        clock = VirtualClock(100.0)
        queue = MemoryQueue(clock=clock)
        loop = _loop(queue, clock, interval_s=5.0)
        replans = []
        keys = [("m7b", "interactive"), ("m13b", "interactive"), ("m7b", "batch-1")]
        keys.append(("m13b", "batch-1"))
        for step, (model, slo_class) in enumerate(keys):
            # a new (model, class) pair cannot join a planned group: a re-plan is due
            request = make_request(
                id=f"r{step}", model=model, slo_class=slo_class, arrival_at_s=clock.now_s()
            )
            await queue.enqueue(request)
            await loop.step()
            replans.append(loop.counters.replans)
            clock.advance_by(2.0)
        return replans

    assert asyncio.run(run()) == [1, 1, 1, 2]


def _shown_ids(plan: PublishedPlan | None) -> list[str]:
    assert plan is not None
    return [rid for g in plan.queue_of("i0") for rid in g.request_ids]


def test_the_next_heads_are_published_once_agents_took_the_first() -> None:
    async def run() -> tuple[list[str], list[str], PublishedPlan | None]:
        clock = VirtualClock(100.0)
        queue = MemoryQueue(clock=clock)
        loop = _loop(queue, clock, interval_s=60.0, members=2)
        for i in range(5):
            await queue.enqueue(make_request(id=f"r{i}", slo_class="batch-2", arrival_at_s=100.0))
        await loop.step()
        first = _shown_ids(await queue.current_plan())
        await queue.pull("i0", first, lease_s=1e6, now_s=100.0)
        clock.advance_by(1.0)
        await loop.step()  # no arrival, no re-plan: only the heads moved
        second = _shown_ids(await queue.current_plan())
        return first, second, await loop.step()

    first, second, third = asyncio.run(run())
    assert len(first) == 2
    assert len(second) == 2
    assert not set(first) & set(second)
    assert third is None  # nothing moved since: no publish


def test_a_held_back_replan_shortens_the_wait_for_the_next_round() -> None:
    async def run() -> tuple[float, float]:
        clock = VirtualClock(100.0)
        queue = MemoryQueue(clock=clock)
        loop = _loop(queue, clock, interval_s=0.5)
        await queue.enqueue(make_request(id="a", arrival_at_s=100.0))
        await loop.step()
        idle = loop._wait_s()
        await queue.enqueue(make_request(id="b", model="m13b", arrival_at_s=100.0))
        clock.advance_by(0.2)
        await loop.step()  # a re-plan is due (new model) but held back until 100.5
        return idle, loop._wait_s()

    idle, due = asyncio.run(run())
    assert idle == 1.0  # the tick
    assert due == pytest.approx(0.3)


def test_the_published_plan_counts_what_is_queued_past_its_head() -> None:
    from qlm.serve.loop import queued_counts

    queued = [make_request(model="m7b", slo_class="batch-2") for _ in range(3)]
    queued.append(make_request(model="m7b", slo_class="interactive"))
    counts = queued_counts(queued)
    assert counts == {"m7b": {"batch-2": 3, "interactive": 1}}
    plan = PublishedPlan(1, 0.0, {}, {}, notes=AgentNotes(queued_counts=counts))
    assert PublishedPlan.from_json(plan.to_json()).notes.queued_counts == counts


def test_arrivals_during_a_solve_are_shown_to_agents_before_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    async def run() -> tuple[tuple[str, ...], bool, PublishedPlan | None]:
        clock = VirtualClock(100.0)
        queue = MemoryQueue(clock=clock)
        loop = _loop(queue, clock, interval_s=0.0)
        release = threading.Event()
        solve = loop.driver.solve
        monkeypatch.setattr(loop.driver, "solve", lambda *a: release.wait(10) and solve(*a))
        # the first plan takes its time
        await queue.enqueue(make_request(id="a", arrival_at_s=100.0))
        stepping = asyncio.ensure_future(loop.step())
        await asyncio.sleep(0.2)
        await queue.enqueue(make_request(id="chat", slo_class="interactive", arrival_at_s=100.0))
        shown: tuple[str, ...] = ()
        for _ in range(100):
            plan = await queue.current_plan()
            if plan is not None and "waiting:m7b" in plan.groups:
                shown = plan.groups["waiting:m7b"].request_ids
                if "chat" in shown:
                    break
            await asyncio.sleep(0.02)
        solving = not stepping.done()
        release.set()
        await stepping
        await loop.step()  # the waiting arrival joined the adopted plan
        after = await queue.current_plan()
        # another re-plan (a new model fits no planned group) that takes its time
        release.clear()
        await queue.enqueue(make_request(id="b", model="m13b", arrival_at_s=100.0))
        stepping = asyncio.ensure_future(loop.step())
        await asyncio.sleep(0.2)
        await queue.enqueue(make_request(id="chat2", slo_class="interactive", arrival_at_s=100.0))
        await asyncio.sleep(0.3)
        during = await queue.current_plan()
        assert during is not None
        assert not stepping.done()
        assert during.groups["waiting:m7b"].request_ids == ("chat2",)
        assert {"a", "chat"} <= {rid for g in during.queue_of("i0") for rid in g.request_ids}
        release.set()
        await stepping
        return shown, solving, after

    shown, solving, after = asyncio.run(run())
    assert shown == ("a", "chat")  # before the first plan, what it is solved over too
    assert solving  # shown while the solve still ran
    assert after is not None
    assert "waiting:m7b" not in after.groups
    assert "chat" in {rid for g in after.groups.values() for rid in g.request_ids}


def test_an_arrival_that_asks_for_a_held_back_replan_is_shown_to_agents_at_once() -> None:
    """A request of a model and class no planned group holds asks for a re-plan, which the
    throttle holds back (rule 3); agents see it meanwhile, instead of after the re-plan."""

    async def run() -> tuple[int, PublishedPlan | None]:
        clock = VirtualClock(100.0)
        queue = MemoryQueue(clock=clock)
        loop = _loop(queue, clock, interval_s=5.0)
        await queue.enqueue(make_request(id="r0", arrival_at_s=clock.now_s()))
        await loop.step()  # the first plan
        clock.advance_by(1.0)
        chat = make_request(
            id="chat", model="m13b", slo_class="interactive", arrival_at_s=clock.now_s()
        )
        await queue.enqueue(chat)
        await loop.step()  # asks for a re-plan, held back until 5 s after the first
        return loop.counters.replans, await queue.current_plan()

    replans, plan = asyncio.run(run())
    assert replans == 1  # still held back
    assert plan is not None
    assert plan.groups["waiting:m13b"].request_ids == ("chat",)


class _CountingQueue(MemoryQueue):
    """Counts the leader-lease renewals and lease sweeps a loop sends."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(clock=clock)
        self.leads = 0
        self.sweeps = 0

    async def try_lead(self, node_id: str, lease_s: float) -> bool:
        self.leads += 1
        return await super().try_lead(node_id, lease_s)

    async def expire_leases(self, now_s: float) -> tuple[str, ...]:
        self.sweeps += 1
        return await super().expire_leases(now_s)


def test_rounds_renew_the_leader_lease_once_a_third_of_it_passed() -> None:
    """Rounds 0.125 s apart over 3 s with a 5 s lease: renewals at 0 and 1.75 s (past 5 / 3),
    not every round; lease sweeps every 0.5 s. Another node's lease is asked for every round."""

    async def run() -> tuple[int, int, int]:
        clock = VirtualClock(100.0)
        queue = _CountingQueue(clock)
        loop = _loop(queue, clock, interval_s=1.0)
        for _ in range(24):
            await loop.step()
            assert loop.counters.leading
            clock.advance_by(0.125)
        leads, sweeps = queue.leads, queue.sweeps
        rival = _loop(queue, clock, interval_s=1.0)
        for _ in range(3):
            await rival.step()
            assert not rival.counters.leading
        return leads, sweeps, queue.leads - leads

    leads, sweeps, rival_asks = asyncio.run(run())
    assert leads == 2  # at 0 and 1.75 s
    assert sweeps == 6  # every 0.5 s from 0 to 2.875 s
    assert rival_asks == 3  # the rival does not lead: it asks every round
