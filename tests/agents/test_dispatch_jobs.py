"""Dispatch of a planned batch job (qlm/prefixes/job_plan.py): the job's order, leaders
first, one part at a time per engine."""

from __future__ import annotations

from qlm.agents.dispatch import PoolMember, PoolRate, dispatch_groups, schedule
from qlm.agents.model_queues import ModelQueues
from qlm.agents.reconcile import QueuedItem
from qlm.control.plan import _group_from_dict, planned_group
from qlm.types import Request
from tests.factories import make_profile

RATE = PoolRate((PoolMember(make_profile("m"), 60_000, 64),))


def job(rid: str, rank: int, leader: str | None, output: int = 50) -> QueuedItem:
    return QueuedItem(rid, 1000, output, "batch", 500.0, 0.0, f"j#{rank:09d}", leader)


def chat(rid: str, deadline_s: float) -> QueuedItem:
    return QueuedItem(rid, 100, 20, "interactive", deadline_s)


# part p0: leader a, followers a1 a2; part p1: leader b, follower b1
JOB = [
    job("a", 0, None),
    job("a1", 1, "a"),
    job("a2", 2, "a"),
    job("b", 3, None),
    job("b1", 4, "b"),
]


def ids(groups: tuple[object, ...]) -> list[list[str]]:
    return [[it.request_id for it in g.items] for g in groups]  # type: ignore[attr-defined]


def test_a_job_runs_in_its_planned_order_whatever_each_request_costs() -> None:
    # costs differ (long outputs later by due time) yet the job's order stands
    items = [job("x", 2, None, output=10), job("y", 0, None, output=900), job("z", 1, None)]
    assert [it.request_id for it in schedule(items, RATE, 0.0).kept] == ["y", "z", "x"]
    queues = ModelQueues()
    for item in items:
        queues.add(item, "m")
    kept = queues.schedule("m", ("i0",), RATE, 0.0)
    assert [it.request_id for it in kept.kept] == ["y", "z", "x"]
    queues.remove(["y"])  # the simulator's queue forgets a job request that left
    assert "y" not in queues
    queues.add(job("w", 3, None), "m")  # a new schedule: without y
    again = queues.schedule("m", ("i0",), RATE, 0.0)
    assert [it.request_id for it in again.kept] == ["z", "x", "w"]


def test_followers_wait_while_their_leader_is_queued_and_later_parts_wait_too() -> None:
    kept = schedule([*JOB, chat("c", 30.0)], RATE, 0.0)
    groups = dispatch_groups("m", kept, 0.0, limit=10)
    assert ids(groups) == [["c", "a"]]  # the chat is not held back by the job


def test_followers_wait_while_their_leader_prefills_on_this_engine() -> None:
    kept = schedule(JOB[1:], RATE, 0.0)  # a was pulled
    here = dispatch_groups("m", kept, 0.0, limit=10, prefilling={"a"})
    assert ids(here) == []  # nothing more of the job until a's prefix is cached
    started = dispatch_groups("m", kept, 0.0, limit=10)
    assert ids(started) == [["a1", "a2", "b"]]  # then the part; b1 waits for b


def test_an_engine_without_the_leader_opens_the_next_part() -> None:
    kept = schedule(JOB[1:], RATE, 0.0)

    def affinity(item: QueuedItem) -> int:  # another instance holds part p0's prefix
        return -1 if item.job_leader == "a" else 0

    other = dispatch_groups("m", kept, 0.0, limit=10, affinity=affinity)
    assert ids(other) == [["b"]]  # b1 waits for b; a's followers stay for a's engine


def test_a_leader_ranked_after_its_members_still_goes() -> None:
    kept = schedule(JOB, RATE, 0.0)

    def affinity(item: QueuedItem) -> int:  # this instance holds the members' prompts more
        return 1 if item.job_leader == "a" else 0

    assert ids(dispatch_groups("m", kept, 0.0, limit=10, affinity=affinity)) == [["a"]]


def test_held_back_members_do_not_use_up_the_limit() -> None:
    members = [job(f"a{i}", i, "a") for i in range(1, 6)]
    kept = schedule([*members, chat("later", 900.0)], RATE, 0.0)
    groups = dispatch_groups("m", kept, 0.0, limit=2, prefilling={"a"})
    assert ids(groups) == [["later"]]  # past five members waiting on a's prefill


def test_a_program_s_forked_call_waits_alone_for_its_leader() -> None:
    """A program's call with a leader but no job (qlm/programs/fork.py) is held back while its
    leader is queued or prefilling here; the requests after it are not."""
    first = QueuedItem("p.s0", 3000, 64, "interactive", 30.0)
    forked = QueuedItem("p.s1", 3000, 64, "interactive", 30.0, job_leader="p.s0")
    later = chat("c", 31.0)
    queued = schedule([first, forked, later], RATE, 0.0)
    assert ids(dispatch_groups("m", queued, 0.0, limit=10)) == [["p.s0", "c"]]
    pulled = schedule([forked, later], RATE, 0.0)  # the leader went to this engine
    assert ids(dispatch_groups("m", pulled, 0.0, limit=10, prefilling={"p.s0"})) == [["c"]]
    assert ids(dispatch_groups("m", pulled, 0.0, limit=10)) == [["p.s1", "c"]]  # it is done


def test_the_published_plan_carries_a_fork_s_leader_to_the_live_agents() -> None:
    """A program call's leader (no batch job) reaches live agents through the plan, as the
    simulator's queue keeps it (qlm/control/plan.py)."""
    calls = [
        Request(f"p.s{k}", "m", 3000, 64, "interactive", 0.0, 30.0, job_leader=leader)
        for k, leader in enumerate((None, "p.s0", "p.s0"))
    ]
    group = planned_group("g", "m", calls)
    assert [group.job_order_of(k) for k in range(3)] == [
        (None, None),
        (None, "p.s0"),
        (None, "p.s0"),
    ]
    grown = planned_group("g", "m", calls[:1]).with_request(
        "p.s1", 3000, 64, "interactive", 30.0, 0.0, (None, "p.s0")
    )
    assert grown.job_order_of(1) == (None, "p.s0")
    restored = _group_from_dict(group.to_dict())  # as the plan is stored and read
    assert restored.job_order_of(2) == (None, "p.s0")
