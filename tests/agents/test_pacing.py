"""Pacing (qlm/agents/pacing.py): requests of a paced class start no earlier than their
deadline, compressed by the pacing factor from their arrival, needs; others are never held."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from qlm.agents.pacing import Pacing, held_back
from qlm.agents.queued import QueuedItem
from qlm.config import QlmConfig, SloClassConfig
from qlm.control.plan import AgentNotes
from qlm.sim.simulate import simulate
from qlm.types import Request
from tests.sim.cases import two_model_fleet

PACING = Pacing(frozenset({"job"}), factor=2.0)


def job(rid: str, arrival_s: float = 0.0) -> QueuedItem:
    return QueuedItem(rid, 100, 10, "job", 1000.0, arrival_s)


def test_a_paced_request_waits_until_its_compressed_deadline_needs_it() -> None:
    kept = [job("a"), job("b")]
    # both due at 1,000 s, 100 s of pool each: compressed from arrival 0 by 2, due at 500 s
    timing = {"a": (1000.0, 100.0), "b": (1000.0, 100.0)}
    held, wake_at_s = held_back(kept, timing, PACING, now_s=0.0)
    assert held == {"a", "b"}
    assert wake_at_s == pytest.approx(300.0)  # b by 400 s, a before it by 300 s
    held, _ = held_back(kept, timing, PACING, now_s=300.0)
    assert held == {"b"}
    assert held_back(kept, timing, PACING, now_s=400.0)[0] == frozenset()


def test_other_classes_are_never_held_and_their_work_makes_room() -> None:
    chat = QueuedItem("chat", 100, 10, "interactive", 30.0, 0.0)
    kept = [chat, job("a")]
    timing = {"chat": (30.0, 20.0), "a": (1000.0, 100.0)}
    held, wake_at_s = held_back(kept, timing, PACING, now_s=0.0)
    assert held == {"a"}
    assert wake_at_s == pytest.approx(400.0)
    # a job request due before a chat's burst starts early enough to leave the chats room
    burst = [job("early"), QueuedItem("c", 100, 10, "interactive", 600.0, 0.0)]
    timing = {"early": (500.0, 100.0), "c": (600.0, 380.0)}
    held, wake_at_s = held_back(burst, timing, PACING, now_s=0.0)
    assert wake_at_s == pytest.approx(120.0)  # by 220 s, before c's latest start


def test_requests_past_the_checked_window_count_and_follow_the_last_checked() -> None:
    kept = [job("a"), job("b"), job("c")]
    timing = {"a": (1000.0, 100.0)}  # b and c unchecked: ~100 s each after a
    held, wake_at_s = held_back(kept, timing, PACING, now_s=0.0)
    assert held == {"a", "b", "c"}
    assert wake_at_s == pytest.approx(200.0)  # 500 - 2 x 100 for the rest - 100 for a
    assert held_back(kept, timing, PACING, now_s=200.0)[0] == frozenset()


def test_unknown_arrival_compresses_from_now() -> None:
    item = job("a", arrival_s=-math.inf)
    held, wake_at_s = held_back([item], {"a": (1000.0, 100.0)}, PACING, now_s=200.0)
    assert held == {"a"}
    assert wake_at_s == pytest.approx(500.0)  # 200 + 800 / 2 - 100


def test_pacing_of_a_configuration() -> None:
    plain = QlmConfig()
    assert Pacing.of(plain) is None
    classes = (*plain.slo_classes, SloClassConfig(name="job", ttft_s=600.0, paced=True))
    config = plain.model_copy(update={"slo_classes": classes})
    assert Pacing.of(config) == Pacing(frozenset({"job"}), 2.0)


def test_a_paced_job_yields_to_chats_and_still_ends_by_its_deadline() -> None:
    classes = (
        SloClassConfig(name="interactive", ttft_s=20.0, lateness_weight=100.0, priority=2),
        SloClassConfig(name="job", ttft_s=600.0, completion_s=600.0, paced=True),
    )
    fleet = two_model_fleet(num_7b=1, num_13b=0)
    jobs = [Request(f"j{k}", "m7b", 500, 100, "job", 0.0, 600.0, 600.0) for k in range(40)]
    chats = [Request(f"c{k}", "m7b", 300, 50, "interactive", 1.0 + k, 21.0 + k) for k in range(10)]
    ttfts = {}
    for paced in (False, True):
        marked = tuple(c.model_copy(update={"paced": paced and c.paced}) for c in classes)
        config = QlmConfig(slo_classes=marked, default_slo_class="interactive")
        result = simulate(fleet, [*jobs, *chats], "qlm", config, 0)
        job_outcomes = [o for o in result.outcomes if o.slo_class == "job"]
        assert all(o.met_slo for o in job_outcomes)
        chat_ttfts = [o.ttft_s for o in result.outcomes if o.slo_class == "interactive"]
        ttfts[paced] = max(t for t in chat_ttfts if t is not None)
        if paced:  # the job spread over its window instead of running at once
            assert max(o.finish_s or 0 for o in job_outcomes) > 100.0
    assert ttfts[True] < ttfts[False]


def test_queued_work_a_live_agent_is_not_shown_counts() -> None:
    kept = [job("a")]
    timing = {"a": (1000.0, 100.0)}
    assert held_back(kept, timing, PACING, now_s=0.0)[1] == pytest.approx(400.0)
    # 3 more paced requests queued past the published head: ~100 s each after a
    held, wake_at_s = held_back(kept, timing, PACING, now_s=0.0, unseen=3)
    assert held == {"a"}
    assert wake_at_s == pytest.approx(100.0)


def test_the_live_agent_paces_on_the_whole_queue_not_only_the_published_head() -> None:
    from qlm.agents.live_queue import AgentQueue
    from qlm.agents.reported_fleet import ReportedFleet
    from qlm.control.plan import PlannedGroup, PublishedPlan
    from qlm.engine.engine_types import EngineObservation, EngineState
    from qlm.types import Fleet
    from tests.factories import make_instance, make_profile

    fleet = Fleet.of([make_instance("i0", loaded_model="m7b")], [make_profile("m7b")])
    group = PlannedGroup("g", "m7b", "job", ("a",), (100,), (10,), ("job",), (1000.0,), (0.0,))
    shown = PublishedPlan(1, 0.0, {"i0": ("g",)}, {"g": group})

    def pulled_now(plan: PublishedPlan) -> list[str]:
        own = EngineObservation("i0", EngineState.READY, "m7b", (), 0, 100_000, 64)
        view = ReportedFleet(fleet, "i0", own, {"job": 0})
        queue = AgentQueue(fleet, "i0", {"job": 0})
        heads = queue.heads(plan, view, lambda _: True, 0.0, 8, None, PACING)
        return [item.request_id for group in heads for item in group.items]

    assert pulled_now(shown) == []  # alone, `a` can wait: it is due by 500 s
    # the plan says 1,000,000 such requests are queued behind it: `a` must start now
    crowded = replace(shown, notes=AgentNotes(queued_counts={"m7b": {"job": 1_000_000}}))
    assert pulled_now(crowded) == ["a"]


def test_the_kept_answer_is_the_answer_made_anew_as_time_passes() -> None:
    import random

    from qlm.agents.dispatch import PoolMember, PoolRate, schedule
    from qlm.agents.live_queue import HeldBackCache
    from qlm.agents.pacing import unheld
    from tests.factories import make_profile

    rng = random.Random(4)
    rate = PoolRate((PoolMember(make_profile("m7b"), 60_000, 64),))
    items = [
        QueuedItem(f"r{k}", rng.randint(50, 3000), rng.randint(10, 400),
                   rng.choice(("job", "job", "interactive")), rng.uniform(5.0, 900.0),
                   rng.uniform(0.0, 5.0))
        for k in range(300)
    ]  # fmt: skip
    cache = HeldBackCache()
    plan = schedule(items, rate, 0.0)
    changed = 0
    for step in range(400):
        now_s = step * 1.5
        if step % 97 == 96:  # a new schedule now and then
            plan = schedule(items[step % 50 :], rate, now_s)
        unseen = 5 if step > 200 else 0
        fresh, _ = unheld(lambda _: True, plan.kept, plan.due_and_cost, PACING, now_s, unseen)
        kept = cache.unheld(lambda _: True, plan, PACING, now_s, unseen)
        held = {it.request_id for it in plan.kept if not fresh(it.request_id)}
        assert held == {it.request_id for it in plan.kept if not kept(it.request_id)}, now_s
        changed += bool(held)
    assert changed > 50, "the schedules must hold requests back for the check to mean much"
