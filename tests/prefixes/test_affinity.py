"""Prefix locality for one instance's dispatch queue (qlm/prefixes/affinity.py): Preble's
exploit rule, and the rent-or-buy hold that leaves another instance's request to it for at
most the prefill it would save."""

from __future__ import annotations

import math

import pytest

from qlm.agents.dispatch import by_affinity
from qlm.agents.queued import QueuedItem
from qlm.prefixes.affinity import (
    ANY,
    HOLD,
    OWN,
    THEIRS,
    PrefixAffinity,
    held_by_reports,
    owner_side,
)
from qlm.types import PrefixBlock

PREFILL_TOKENS_PER_S = 1000.0


def prefill_s(tokens: int) -> float:
    return tokens / PREFILL_TOKENS_PER_S


def item(request_id: str, prompt: int = 1000, deadline_s: float = math.inf) -> QueuedItem:
    return QueuedItem(request_id, prompt, 10, "", deadline_s)


@pytest.mark.parametrize(
    ("held", "side"),
    [
        ({}, ANY),
        ({"a": 600}, OWN),
        ({"b": 600}, THEIRS),
        ({"a": 600, "b": 600}, OWN),  # a tie: both are owners
        ({"a": 300, "b": 600}, THEIRS),
        ({"b": 500}, ANY),  # half cached, half missed: explore
        ({"a": 400}, ANY),
    ],
)
def test_the_owner_holds_more_of_the_prompt_than_it_would_compute(
    held: dict[str, int], side: int
) -> None:
    assert owner_side("a", held, 1000) == side


def test_another_instances_request_is_held_back_for_the_prefill_it_saves_then_taken() -> None:
    held = {"x": {"b": 800}, "y": {"a": 900}, "z": {"b": 300}}
    deferred: dict[str, float] = {}

    def at(now_s: float) -> tuple[dict[str, int], float]:
        rule = PrefixAffinity("a", lambda it: held.get(it.request_id), prefill_s, deferred, now_s)
        sides = {rid: rule(item(rid)) for rid in ("x", "y", "z", "w")}
        rule.prune()
        return sides, rule.wake_at_s

    sides, wake_at_s = at(10.0)
    assert sides == {"x": HOLD, "y": OWN, "z": ANY, "w": ANY}
    assert wake_at_s == pytest.approx(10.8)  # 800 tokens more to compute here: 0.8 s
    assert at(10.5)[0]["x"] == HOLD  # still counted from when it was first held back
    sides, wake_at_s = at(10.8)
    assert sides["x"] == THEIRS
    assert wake_at_s == math.inf


def test_a_hold_never_makes_the_request_miss_its_deadline_here() -> None:
    rule = PrefixAffinity("a", lambda _: {"b": 900}, prefill_s, {}, 10.0)
    # a full prefill here (1 s) must start by 10.5 to meet 11.5: hold until then, not 10.9
    assert rule(item("x", deadline_s=11.5)) == HOLD
    assert rule.wake_at_s == pytest.approx(10.5)
    at_the_limit = PrefixAffinity("a", lambda _: {"b": 900}, prefill_s, {}, 10.5)
    assert at_the_limit(item("x", deadline_s=11.5)) == THEIRS
    # past it, only the owner (0.1 s of prefill) can still make it: the hold runs its course
    late = PrefixAffinity("a", lambda _: {"b": 900}, prefill_s, {}, 10.6)
    assert late(item("x", deadline_s=11.5)) == HOLD
    assert late.wake_at_s == pytest.approx(11.5)


def test_pruning_forgets_requests_not_seen_again() -> None:
    deferred: dict[str, float] = {}
    first = PrefixAffinity("a", lambda _: {"b": 900}, prefill_s, deferred, 1.0)
    first(item("x"))
    first.prune()
    assert deferred == {"x": 1.0}
    second = PrefixAffinity("a", lambda _: {"b": 900}, prefill_s, deferred, 2.0)
    second.prune()  # x was pulled elsewhere: not offered again
    assert deferred == {}


def test_held_back_requests_leave_the_dispatch_queue() -> None:
    sides = {"mine": OWN, "held": HOLD, "theirs": THEIRS, "plain": ANY}
    ordered = by_affinity([item(r) for r in sides], lambda it: sides[it.request_id])
    assert [it.request_id for it in ordered] == ["mine", "plain", "theirs"]


def test_a_stream_of_own_requests_does_not_make_the_most_urgent_one_late() -> None:
    """Ten requests this instance holds, each 1 s of the pool, due late; one it does not hold
    (ANY), due done within 3 s. Locality alone serves it eleventh (done at 11 s: late); with
    the schedule's due times it goes third, the latest place that still keeps it (done at
    3 s), and the instance's own go first while they can."""
    sides = {f"own{i}": OWN for i in range(10)} | {"x": ANY}
    due = {f"own{i}": (50.0 + i, 1.0) for i in range(10)} | {"x": (3.0, 1.0)}
    items = [item("x")] + [item(f"own{i}") for i in range(10)]  # in due order

    def side(it: QueuedItem) -> int:
        return sides[it.request_id]

    alone = [it.request_id for it in by_affinity(items, side)]
    assert alone.index("x") == 10
    ordered = [it.request_id for it in by_affinity(items, side, due, now_s=0.0)]
    assert ordered == ["own0", "own1", "x", *(f"own{i}" for i in range(2, 10))]
    relaxed = {**due, "x": (100.0, 1.0)}  # with room to spare, locality keeps its order
    assert [it.request_id for it in by_affinity(items, side, relaxed, now_s=0.0)] == alone


def test_held_back_and_unchecked_requests_never_jump_the_locality_order() -> None:
    """A request held back for its owner stays out even when due first; one the schedule did
    not check (no due time) never forces a place; each request is listed once."""
    sides = {"held": HOLD, "plain": ANY, "own0": OWN, "own1": OWN}
    due = {"held": (0.5, 1.0), "own0": (50.0, 1.0), "own1": (51.0, 1.0)}  # plain: unchecked
    items = [item(r) for r in ("held", "plain", "own0", "own1")]
    ordered = by_affinity(items, lambda it: sides[it.request_id], due, now_s=0.0)
    assert [it.request_id for it in ordered] == ["own0", "own1", "plain"]


def test_a_prompt_every_pool_member_holds_alike_is_nobodys_own() -> None:
    """Owning means being the cheaper place: a hot prefix every instance on the model holds
    as much of costs the same anywhere, so it is ANY (it must not go first everywhere,
    ahead of requests nobody owns); one instance of the pool holding less makes it OWN
    again for the others; without the pool the rule is Preble's alone."""
    everyone = {"a": 4000, "b": 4000, "c": 4000}
    assert owner_side("a", everyone, 5000, pool=("a", "b", "c")) == ANY
    assert owner_side("a", everyone, 5000) == OWN
    assert owner_side("a", everyone, 5000, pool=("a", "b", "c", "d")) == OWN  # d holds none
    assert owner_side("d", everyone, 5000, pool=("a", "b", "c", "d")) == THEIRS


def test_reports_give_the_leading_blocks_each_instance_holds() -> None:
    prefix = (PrefixBlock(1, 500), PrefixBlock(2, 300), PrefixBlock(3, 100))
    reported = {"a": frozenset({1, 2}), "b": frozenset({2, 3}), "c": frozenset({1, 2, 3})}
    # b holds later blocks but not the first: a chained key means a different prompt
    assert held_by_reports(reported, prefix) == {"a": 800, "c": 900}


def test_held_for_many_prompts_is_held_by_reports_for_each() -> None:
    import random

    from qlm.prefixes.affinity import HeldByReports

    rng = random.Random(9)
    # prompts as paths in a tree of chained keys: shared heads, own tails
    heads = [
        tuple(PrefixBlock(1000 * h + d, rng.randint(1, 50)) for d in range(8)) for h in range(4)
    ]
    prompts = []
    for k in range(300):
        head = heads[rng.randrange(4)][: rng.randint(0, 8)]
        tail = tuple(PrefixBlock(10**6 + 100 * k + d, 20) for d in range(rng.randint(0, 4)))
        prompts.append(head + tail)
    blocks = [b.key for head in heads for b in head] + [p[-1].key for p in prompts if p]
    reported = {i: frozenset(rng.sample(blocks, k=len(blocks) // 2)) for i in "abc"}
    many = HeldByReports(reported)
    for prefix in prompts:
        assert many.held(prefix) == held_by_reports(reported, prefix)
