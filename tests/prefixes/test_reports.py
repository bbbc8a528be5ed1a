"""The loop's `prefix_held` (qlm/prefixes/reports.py, `PrefixHeld`): what each instance holds
of each shown request's prompt, from the agents' reports, kept only while the reports stay."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from qlm.prefixes.affinity import HeldByReports, held_by_reports
from qlm.prefixes.reports import PrefixHeld
from qlm.queue.records import InstanceStatus
from qlm.types import PrefixBlock
from tests.factories import make_request

SHARED = (PrefixBlock(1, 100), PrefixBlock(2, 100))


def status(instance_id: str, keys: tuple[int, ...]) -> InstanceStatus:
    return InstanceStatus(instance_id, "ready", "m7b", 0.0, 0, 0, 1, 0.0, prefix_keys=keys)


def test_held_follows_the_reports_and_only_shown_requests_get_it() -> None:
    queued = [
        replace(make_request(id=f"r{k}", model="m7b"), prefix=(*SHARED, PrefixBlock(100 + k, 50)))
        for k in range(6)
    ]
    shown = {r.id for r in queued[:4]}
    held = PrefixHeld()
    first = held.on(shown, queued, [status("a", (1, 2, 101)), status("b", (2,))])
    assert first == {rid: {"a": 200} for rid in ("r0", "r2", "r3")} | {"r1": {"a": 250}}
    # the reports move on: the answers are made anew from them
    reports = [status("a", (1,)), status("b", (1, 2, 103))]
    second = held.on(shown, queued, reports)
    reported = {s.instance_id: frozenset(s.prefix_keys) for s in reports}
    expected = {r.id: held_by_reports(reported, r.prefix) for r in queued[:4]}
    assert second == expected
    assert held.on(shown, queued, []) == {}  # no reports: nothing held


def test_a_report_that_changes_renews_only_that_instances_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queued = [
        replace(make_request(id=f"r{k}", model="m7b"), prefix=(*SHARED, PrefixBlock(100 + k, 50)))
        for k in range(3)
    ]
    shown = {r.id for r in queued}
    walks: list[frozenset[str]] = []
    walk = HeldByReports.held

    def counted(self: HeldByReports, prefix: tuple[PrefixBlock, ...]) -> dict[str, int]:
        walks.append(frozenset(self.reported))
        return walk(self, prefix)

    monkeypatch.setattr(HeldByReports, "held", counted)
    held = PrefixHeld()
    held.on(shown, queued, [status("a", (1, 2)), status("b", (1,))])
    assert len(walks) == 6  # every shown prompt, once per instance
    walks.clear()
    held.on(shown, queued, [status("a", (1, 2)), status("b", (1,))])
    assert walks == []  # nothing changed: every answer kept
    after = held.on(shown, queued, [status("a", (1, 2)), status("b", (1, 2, 102))])
    assert walks == [frozenset({"b"})] * 3  # only b's report changed
    assert after == {"r0": {"a": 200, "b": 200}, "r1": {"a": 200, "b": 200},
                                       "r2": {"a": 200, "b": 250}}  # fmt: skip


def test_answers_kept_by_difference_match_a_walk_from_scratch_every_round() -> None:
    rng = random.Random(5)
    blocks = [PrefixBlock(k, 16 * (1 + k % 3)) for k in range(1, 13)]

    def prompt(k: int) -> tuple[PrefixBlock, ...]:  # chained keys: shared leading blocks
        return (*blocks[: 1 + rng.randrange(10)], PrefixBlock(1000 + k, 8))

    pool = [
        replace(make_request(id=f"r{k}", model=rng.choice(("m7b", "m13b"))), prefix=prompt(k))
        for k in range(40)
    ]
    held = PrefixHeld()
    for _ in range(60):
        queued = rng.sample(pool, 25)
        shown = {r.id for r in queued[:18]}
        statuses = [
            replace(
                status(i, tuple(rng.sample(range(1, 13), rng.randrange(0, 12)))),
                model=rng.choice(("m7b", "m13b")),
            )
            for i in ("a", "b", "c")
            if rng.random() < 0.9
        ]
        got = held.on(shown, queued, statuses)
        expected = {}
        for request in queued[:18]:
            reported = {
                s.instance_id: frozenset(s.prefix_keys)
                for s in statuses
                if s.model == request.model and s.prefix_keys
            }
            if tokens := held_by_reports(reported, request.prefix):
                expected[request.id] = tokens
        assert got == expected
