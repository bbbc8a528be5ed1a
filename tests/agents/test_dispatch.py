"""Dispatch within the plan (qlm/agents/dispatch.py): the schedule keeps the most requests
that can meet their deadlines, late ones go last, swaps never strand a model's queue."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from qlm.agents.dispatch import (
    LATE_CLASS,
    Job,
    PoolMember,
    PoolRate,
    Schedule,
    dispatch_groups,
    follows_swap,
    job_of,
    schedule_jobs,
)
from qlm.agents.model_queues import ModelQueues
from qlm.agents.reconcile import QueuedGroup, QueuedItem
from tests.factories import make_profile


def _item(rid: str, deadline_s: float, prompt: int = 100, output: int = 50) -> QueuedItem:
    return QueuedItem(rid, prompt, output, "interactive", deadline_s)


def _feasible(jobs: list[Job], now_s: float) -> bool:
    """Whether all jobs meet their due times served in due order on one machine."""
    done_s = now_s
    for due_s, _, cost_s, _ in sorted(jobs, key=lambda j: j[0]):
        done_s += cost_s
        if done_s > due_s + 1e-9:
            return False
    return True


def _most_feasible(jobs: list[Job], now_s: float) -> int:
    for size in range(len(jobs), -1, -1):
        if any(_feasible(list(c), now_s) for c in itertools.combinations(jobs, size)):
            return size
    return 0


@pytest.mark.parametrize("seed", range(40))
def test_schedule_keeps_as_many_as_any_subset_can_meet(seed: int) -> None:
    """Moore-Hodgson is optimal for the most on-time jobs on one machine: checked against
    every subset of small random instances, and what it keeps is itself feasible."""
    rng = np.random.default_rng(seed)
    jobs: list[Job] = []
    for k in range(int(rng.integers(1, 9))):
        cost_s = float(rng.uniform(0.1, 5.0))
        due_s = float(rng.uniform(0.0, 15.0))
        jobs.append((due_s, f"r{k}", cost_s, _item(f"r{k}", due_s)))
    result = schedule_jobs(sorted(jobs), 0.0)
    kept = [j for j in jobs if j[3] in result.kept]
    assert len(result.kept) + len(result.dropped) == len(jobs)
    assert _feasible(kept, 0.0)
    assert len(kept) == _most_feasible(jobs, 0.0)
    dues = [next(j[0] for j in jobs if j[3] == it) for it in result.kept]
    assert dues == sorted(dues)  # served earliest-due first


def test_schedule_drops_the_costliest_under_overload() -> None:
    """One long request and five short ones due at the same time: keeping the long one
    would make the short ones late, so it goes to the back."""
    jobs: list[Job] = [(10.0, "long", 9.0, _item("long", 10.0))]
    jobs += [(10.0, f"s{k}", 1.5, _item(f"s{k}", 10.0)) for k in range(5)]
    result = schedule_jobs(sorted(jobs), 0.0)
    assert [it.request_id for it in result.dropped] == ["long"]
    assert len(result.kept) == 5


def test_only_the_head_is_checked_when_asked() -> None:
    jobs: list[Job] = [(1.0 * k, f"r{k}", 2.0, _item(f"r{k}", 1.0 * k)) for k in range(10)]
    result = schedule_jobs(jobs, 0.0, max_jobs=3)
    assert [it.request_id for it in result.kept][-7:] == [f"r{k}" for k in range(3, 10)]


def test_dispatch_queue_puts_late_and_dropped_requests_last() -> None:
    kept = (_item("a", 5.0), _item("late", 1.0), _item("b", 9.0))
    plan = Schedule(kept, (_item("dropped", 8.0),))
    groups = dispatch_groups("m", plan, now_s=2.0, limit=10)
    assert [[it.request_id for it in g.items] for g in groups] == [
        ["a", "b"],
        ["late", "dropped"],
    ]
    assert all(g.in_order for g in groups)
    assert {it.slo_class for it in groups[1].items} == {LATE_CLASS}
    cut = dispatch_groups("m", plan, now_s=2.0, limit=1, is_queued=lambda rid: rid != "a")
    assert [[it.request_id for it in g.items] for g in cut] == [["b"]]


def test_pool_cost_prices_long_prompts_by_their_batch() -> None:
    """A mega prompt costs more than its tokens' share: it leaves room for few peers."""
    profile = make_profile("m7b")
    member = PoolMember(profile, kv_capacity_tokens=60_000, max_num_seqs=256)
    short_s, _ = member.cost_s(500, 100)
    long_s, prefill_s = member.cost_s(50_000, 100)
    assert prefill_s == pytest.approx(profile.prefill_s(50_000))
    assert long_s - prefill_s > 30 * (short_s - profile.prefill_s(500))  # batch 1 vs 64
    pool = PoolRate((member, member))
    assert pool.cost_s(_item("x", 1.0, 500, 100))[0] == pytest.approx(short_s / 2)
    assert PoolRate(()).cost_s(_item("x", 1.0))[0] == math.inf


def _group(model: str) -> QueuedGroup:
    return QueuedGroup(f"g-{model}", model, "batch-1", (_item(f"r-{model}", 9.0),))


def test_swaps_follow_the_plan_only_when_they_pay() -> None:
    def never() -> bool:
        return False

    def always() -> bool:
        return True

    away = (_group("b"),)
    assert follows_swap("a", away, model_queued=3, swap_pays=always)
    assert not follows_swap("a", away, model_queued=0, swap_pays=never)  # idle, but no gain
    back = (_group("b"), _group("a"))  # the plan returns to this model: serve it first
    assert not follows_swap("a", back, model_queued=3, swap_pays=always)
    assert follows_swap("a", back, model_queued=0, swap_pays=always)
    assert not follows_swap("a", (_group("a"),), model_queued=0, swap_pays=always)
    assert follows_swap(None, away, model_queued=0, swap_pays=never)  # empty: load
    assert not follows_swap("a", (), model_queued=0, swap_pays=always)


def test_model_queues_price_once_and_forget_what_left() -> None:
    profile = make_profile("m7b")
    rate = PoolRate((PoolMember(profile, 60_000, 64),))
    queues = ModelQueues()
    for k in range(4):
        queues.add(_item(f"r{k}", 10.0 + k), "m7b")
    first = queues.schedule("m7b", ("i0",), rate, 0.0)
    assert queues.schedule("m7b", ("i0",), rate, 0.0) is first  # kept until a change
    queues.remove(["r0"])
    assert "r0" not in queues
    assert queues.count("m7b") == 3
    queues.add(_item("r1", 11.0), "m7b")  # back from an engine: priced again, listed once
    again = queues.schedule("m7b", ("i0",), rate, 0.0)
    assert again is not first
    assert [it.request_id for it in again.kept + again.dropped].count("r1") == 1
    assert "r0" not in [it.request_id for it in again.kept + again.dropped]


@pytest.mark.parametrize("seed", range(20))
def test_a_standing_schedule_lists_every_request_of_its_window(seed: int) -> None:
    """Joins past the window keep the schedule; a join inside it, or a leave from it while
    others wait past it, remakes it: whatever the order of joins and leaves, the first
    `max_jobs` queued requests by due time (less their class's blocked work) are listed."""
    rng = np.random.default_rng(seed)
    rate = PoolRate((PoolMember(make_profile("m7b"), 60_000, 64),))
    blocked = {"batch-1": 4.0}
    queues = ModelQueues(max_jobs=3)
    queued: dict[str, QueuedItem] = {}
    for step in range(60):
        if queued and rng.random() < 0.45:
            gone = sorted(queued)[int(rng.integers(len(queued)))]
            queues.remove([gone])
            del queued[gone]
        else:
            slo = str(rng.choice(["interactive", "batch-1"]))
            item = QueuedItem(f"r{step}", 100, 50, slo, float(rng.uniform(1.0, 60.0)))
            queues.add(item, "m7b")
            queued[item.request_id] = item
        plan = queues.schedule("m7b", ("i0",), rate, 0.0, blocked.copy)
        jobs = sorted(job_of(it, rate) for it in queued.values())
        window = sorted((due_s - blocked.get(it.slo_class, 0.0), rid) for due_s, rid, _, it in jobs)
        listed = {it.request_id for it in plan.kept + plan.dropped}
        assert {rid for _, rid in window[:3]} <= listed


def test_requests_past_saving_leave_the_window_to_those_that_can_still_be_kept() -> None:
    """Under overload the earliest-due requests are often already late: they must not fill
    the window the schedule checks, or it serves only late requests, each a little later."""
    rate = PoolRate((PoolMember(make_profile("m7b"), 60_000, 64),))
    queues = ModelQueues(max_jobs=3)
    for k in range(8):
        queues.add(_item(f"late{k}", 1.0 + k), "m7b")
    queues.add(_item("savable", 30.0), "m7b")
    plan = queues.schedule("m7b", ("i0",), rate, 10.0)
    assert [it.request_id for it in plan.kept] == ["savable"]
    assert [it.request_id for it in plan.dropped] == ["late0", "late1", "late2"]
    first = dispatch_groups("m7b", plan, 10.0, 4, queues.queued("m7b"))
    assert [it.request_id for g in first for it in g.items] == [
        "savable",
        "late0",
        "late1",
        "late2",
    ]
    queues.remove(["late0", "savable"])
    again = queues.schedule("m7b", ("i0",), rate, 10.0)
    assert "late0" not in [it.request_id for it in again.kept + again.dropped]


def test_every_request_set_aside_is_listed_in_turn_with_no_arrival_to_remake_it() -> None:
    """More requests past saving than the schedule lists (it lists the first `max_jobs`):
    once those listed are served, the next schedule lists those past them. It did not: with
    the arrivals over, nothing remade the schedule and the rest waited forever (61 requests
    of sims/wb.yaml never served under qlm)."""
    rate = PoolRate((PoolMember(make_profile("m7b"), 60_000, 64),))
    queues = ModelQueues(max_jobs=3)
    for k in range(8):
        queues.add(_item(f"late{k}", 1.0 + k), "m7b")
    served: list[str] = []
    for _ in range(8):
        plan = queues.schedule("m7b", ("i0",), rate, 100.0)
        groups = dispatch_groups("m7b", plan, 100.0, 2, queues.queued("m7b"))
        pulled = [it.request_id for g in groups for it in g.items]
        if not pulled:
            break
        queues.remove(pulled)
        served += pulled
    assert sorted(served) == [f"late{k}" for k in range(8)]
    assert queues.count("m7b") == 0


def test_overload_past_the_window_sheds_over_the_whole_queue() -> None:
    """A fast stream fills the deadline horizon with more requests than the window holds:
    only Moore-Hodgson over the whole queue sees that they cannot all be kept."""
    rate = PoolRate((PoolMember(make_profile("m7b"), 60_000, 64),))
    cost_s, prefill_s = rate.cost_s(_item("probe", 0.0))
    deadline_s = 4.5 * cost_s + prefill_s - cost_s  # due at 4.5 costs: 4 fit
    queues = ModelQueues(max_jobs=3)
    for k in range(10):
        queues.add(_item(f"r{k}", deadline_s), "m7b")
    plan = queues.schedule("m7b", ("i0",), rate, 0.0)
    assert len(plan.kept) == 4  # the window alone would keep 3 and list 3 more as on time
    kept = {it.request_id for it in plan.kept}
    assert not kept & {it.request_id for it in plan.dropped}  # 3 of the 6 set aside listed
