"""The live loop publishes plans pruned to what is still queued."""

from __future__ import annotations

from qlm.queue.records import PlannedGroup, PublishedPlan
from qlm.serve.loop import _still_queued
from tests.factories import make_request


def test_published_plan_drops_members_that_left_the_queue() -> None:
    group = PlannedGroup(
        "g", "m7b", "batch-2", ("a", "b", "c"), (1, 2, 3), (4, 5, 6), ("x", "y", "z")
    )
    plan = PublishedPlan(1, 0.0, {"i0": ("g",)}, {"g": group})
    pruned = _still_queued(plan, [make_request(id="c"), make_request(id="a")])
    kept = pruned.groups["g"]
    assert kept.request_ids == ("a", "c")
    assert kept.prompt_tokens == (1, 3)
    assert kept.max_output_tokens == (4, 6)
    assert kept.slo_classes == ("x", "z")
    assert pruned.queues == plan.queues
