"""The live agent's kept dispatch queue (qlm/agents/live_queue.py) answers what a new one
answers from nothing, round after round, while plans, arrivals and pulls change it."""

from __future__ import annotations

import random

from qlm.agents.live_queue import AgentQueue
from qlm.agents.reported_fleet import ReportedFleet
from qlm.agents.virtual_queue import planned_items
from qlm.control.plan import PlannedGroup, PublishedPlan
from qlm.engine.engine_types import EngineObservation, EngineState
from qlm.queue.records import InstanceStatus
from qlm.types import Fleet
from tests.factories import make_instance, make_profile

INSTANCES = ("i0", "i1", "i2")
PRIORITY = {"batch-1": 1}


def view(the_fleet: Fleet) -> ReportedFleet:
    """i0 idle on m7b; i1 and i2 reporting m7b loaded: the pool is all three."""
    own = EngineObservation("i0", EngineState.READY, "m7b", (), 0, 100_000, 64)
    reports = {i: InstanceStatus(i, "ready", "m7b", 0.0, 0, 0, 100_000, 0.0) for i in INSTANCES[1:]}
    return ReportedFleet(the_fleet, "i0", own, PRIORITY, reports)


def fleet() -> Fleet:
    instances = [make_instance(i, loaded_model="m7b") for i in INSTANCES]
    return Fleet.of(instances, [make_profile("m7b")])


def random_plan(rng: random.Random, epoch: int, ids: list[str]) -> PublishedPlan:
    """The ids cut into groups (some listed twice), dealt to the instances; every request
    keeps its own fields whatever plan lists it."""
    order = list(ids)
    rng.shuffle(order)
    groups: dict[str, PlannedGroup] = {}
    queues: dict[str, list[str]] = {i: [] for i in INSTANCES}
    while order:
        size = rng.randint(1, 12)
        members, order = order[:size], order[size:]
        if rng.random() < 0.1 and order:
            members.append(order[0])  # also in the next group (a virtual queue may do that)
        gid = f"g{epoch}-{len(groups)}"
        n = [int(rid[1:]) for rid in members]
        groups[gid] = PlannedGroup(
            gid, "m7b", "batch-1", tuple(members), tuple(100 + 37 * k % 900 for k in n),
            tuple(20 + k % 50 for k in n), ("batch-1",) * len(members),
            tuple(600.0 + k for k in n), tuple(float(k) / 10 for k in n),
        )  # fmt: skip
        queues[rng.choice(INSTANCES)].append(gid)
    return PublishedPlan(epoch, 0.0, {i: tuple(q) for i, q in queues.items()}, groups)


def ids_of(heads: tuple[object, ...]) -> list[list[str]]:
    return [[item.request_id for item in group.items] for group in heads]  # type: ignore[attr-defined]


def test_kept_queue_matches_the_queue_made_from_nothing_round_after_round() -> None:
    rng = random.Random(11)
    the_fleet = fleet()
    kept = AgentQueue(the_fleet, "i0", PRIORITY)
    seen = view(the_fleet)
    queued = [f"r{k}" for k in range(300)]
    next_id = 300
    plan = random_plan(rng, 0, queued)
    for round_ in range(60):
        taken = set(rng.sample(queued, k=min(len(queued), rng.randint(0, 15))))
        if round_ % 3 == 0:  # a new plan with arrivals and without what left
            queued = [rid for rid in queued if rid not in taken] + [
                f"r{k}" for k in range(next_id, next_id + rng.randint(0, 20))
            ]
            next_id += 20
            taken = set()
            plan = random_plan(rng, round_ + 1, queued)

        def is_queued(rid: str, gone: set[str] = taken) -> bool:
            return rid not in gone

        now_s = float(round_)
        limit = rng.choice((4, 16, 64))
        fresh = AgentQueue(the_fleet, "i0", PRIORITY).heads(plan, seen, is_queued, now_s, limit)
        assert ids_of(kept.heads(plan, seen, is_queued, now_s, limit)) == ids_of(fresh)
        assert fresh, "the scenario must leave something to dispatch"


def test_a_request_pulled_under_a_standing_schedule_is_not_offered_again() -> None:
    rng = random.Random(3)
    the_fleet = fleet()
    kept = AgentQueue(the_fleet, "i0", PRIORITY)
    plan = random_plan(rng, 0, [f"r{k}" for k in range(40)])
    first = ids_of(kept.heads(plan, view(the_fleet), lambda _: True, 0.0, 8))[0]
    gone = set(first[:3])
    again = ids_of(kept.heads(plan, view(the_fleet), lambda rid: rid not in gone, 0.1, 8))[0]
    assert not gone & set(again)
    assert again[:5] == first[3:8]


def test_members_are_read_once_and_reused_by_the_next_plan() -> None:
    rng = random.Random(5)
    first = random_plan(rng, 0, [f"r{k}" for k in range(50)])
    items = planned_items(first, "m7b", {})
    assert sorted(items) == sorted(f"r{k}" for k in range(50))
    second = random_plan(rng, 1, [f"r{k}" for k in range(25, 75)])
    again = planned_items(second, "m7b", items)
    assert all(again[f"r{k}"] is items[f"r{k}"] for k in range(25, 50))
    assert again["r60"].prompt_tokens == 100 + 37 * 60 % 900
    assert planned_items(second, "other-model", items) == {}


def test_members_are_noted_as_arrivals_once_in_arrival_order_and_pruned_seldom() -> None:
    rng = random.Random(8)
    the_fleet = fleet()
    kept = AgentQueue(the_fleet, "i0", PRIORITY)
    arrived: list[float] = []
    kept.decision.arrived = lambda model, item: arrived.append(item.arrival_at_s)  # type: ignore[method-assign]
    ids = [f"r{k}" for k in range(8300)]  # r{k} arrives at k/10 s
    noted_before = None
    rebuilt = 0
    for round_ in range(80):  # 300 members, 100 new a round (and 100 gone), 10 s apart
        members = ids[100 * round_ : 300 + 100 * round_]
        plan = random_plan(rng, round_, members)
        kept.heads(plan, view(the_fleet), lambda _: True, 30.0 + 10 * round_, 8)
        rebuilt += kept._noted is not noted_before and noted_before is not None
        noted_before = kept._noted
    assert sorted(arrived) == [k / 10 for k in range(8200)]  # each once
    assert arrived[300:400] == sorted(arrived[300:400])  # a round's in arrival order
    # 800 s of arrivals against a 120 s window: pruned now and then, not every round
    assert 0 < rebuilt <= 5
    assert len(kept._noted) < 5000
