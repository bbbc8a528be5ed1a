"""A planned batch job's parts (qlm/prefixes/job_plan.py) stay groups of their own, whatever
the policy would cluster them into, on a regroup and on inserts alike."""

from __future__ import annotations

import dataclasses

import pytest

from qlm.config import GroupingConfig
from qlm.grouping import make_grouping
from qlm.types import Request
from tests.factories import make_request
from tests.grouping.test_grouping import POLICIES, mixed_queue


def planned(n: int, parts: int) -> list[Request]:
    """A job whose parts mix lengths (k-means would split them by length)."""
    out = []
    for i in range(n):
        r = make_request(id=f"job-{i}", prompt_tokens=50 + 300 * (i % 7), slo_class="batch-2")
        out.append(dataclasses.replace(r, job_group=f"j/p{i % parts}", job_order=f"j#{i:09d}"))
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_parts_are_groups_on_regroup_and_on_insert(policy: str) -> None:
    config = GroupingConfig.model_validate({"policy": policy, "avg_batch_size": 32})
    grouping = make_grouping(config)
    others = mixed_queue(200)
    job = planned(60, parts=3)
    groups = grouping.regroup([*others, *job[:45]], now_s=0.0)
    for request in job[45:]:
        grouping.add(request)
    members = {rid: g.id for g in grouping.groups() for rid in g.request_ids}
    by_part: dict[str, set[str]] = {}
    for request in job:
        by_part.setdefault(request.job_group or "", set()).add(members[request.id])
    assert all(len(ids) == 1 for ids in by_part.values())  # a part is one group
    job_groups = {gid for ids in by_part.values() for gid in ids}
    assert len(job_groups) == 3
    assert not any(members[r.id] in job_groups for r in others)  # and only the part
    assert sum(len(g.request_ids) for g in groups) == 245
