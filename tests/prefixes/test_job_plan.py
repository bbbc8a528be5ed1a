"""A batch job planned as a whole (qlm/prefixes/job_plan.py): groups by the deepest shared
prefix, siblings by decode ratio, parts within the budget, leaders first."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from qlm.prefixes.job_plan import PlanBudget, job_budget, plan_job, with_plan
from qlm.types import Fleet, PrefixBlock, Request
from tests.factories import make_instance, make_profile

WIDE = PlanBudget(kv_tokens=10**9, max_requests=10**6)


def req(rid: str, blocks: tuple[tuple[int, int], ...], own: int, out: int) -> Request:
    prefix = tuple(PrefixBlock(k, t) for k, t in blocks)
    prompt = sum(t for _, t in blocks) + own
    return Request(rid, "m", prompt, out, "batch", 0.0, 100.0, prefix=prefix)


def test_each_request_joins_its_deepest_shared_prefix() -> None:
    # system prompt 1 under everything; documents 2 and 3 under it; 4 under 2 only once
    requests = [
        req("a", ((1, 100), (2, 500)), 10, 10),
        req("b", ((1, 100), (2, 500), (4, 50)), 10, 10),
        req("c", ((1, 100), (3, 500)), 10, 10),
        req("d", ((1, 100), (3, 500)), 10, 10),
        req("e", ((1, 100), (5, 500)), 10, 10),  # its document is its own
        req("f", ((9, 100),), 10, 10),  # shares nothing
    ]
    plan = plan_job("j", requests, WIDE)
    members = {frozenset(p.request_ids): p.shared_tokens for p in plan.parts}
    assert members == {
        frozenset("ab"): 600,  # block 4 is b's alone: it does not split a from b
        frozenset("cd"): 600,
        frozenset("e"): 100,
        frozenset("f"): 0,
    }


def test_siblings_go_by_decode_ratio_and_subtrees_stay_together() -> None:
    requests = [
        req("short1", ((1, 100), (2, 1000)), 10, 5),
        req("short2", ((1, 100), (2, 1000)), 10, 5),
        req("long1", ((1, 100), (3, 1000)), 10, 900),
        req("long2", ((1, 100), (3, 1000)), 10, 700),
        req("other1", ((7, 100),), 10, 50),
        req("other2", ((7, 100),), 10, 60),
    ]
    order = [rid for p in plan_job("j", requests, WIDE).parts for rid in p.request_ids]
    # at the root, subtree 7 (110 output tokens over 120 computed: 0.92) before subtree 1
    # (1,610 over 2,140: 0.75); under 1, document 3 (1,600 out) before document 2 (10 out)
    # each part's leader (its shortest output) first, then longest output first
    assert order == ["other1", "other2", "long2", "long1", "short2", "short1"]


def test_parts_respect_the_budget_and_leaders_lead() -> None:
    requests = [req(f"r{i}", ((1, 1000),), 100, 100 + i) for i in range(10)]
    budget = PlanBudget(kv_tokens=1000 + 3 * 210, max_requests=8, group_requests=8)
    plan = plan_job("j", requests, budget)
    assert [len(p.request_ids) for p in plan.parts] == [3, 3, 3, 1]
    assert all(p.kv_tokens <= budget.kv_tokens for p in plan.parts)
    planned = {r.id: r for r in with_plan(requests, plan, "j")}
    for part in plan.parts:
        leader, *rest = part.request_ids
        assert planned[leader].job_leader is None
        assert all(planned[rid].job_leader == leader for rid in rest)
        assert len({planned[rid].job_group for rid in part.request_ids}) == 1
    groups = [planned[p.request_ids[0]].job_group for p in plan.parts]
    assert groups == ["j/g0", "j/g0", "j/g1", "j/g1"]  # runs of parts up to 8 requests
    ranks = sorted(planned.values(), key=lambda r: r.job_order or "")
    # parts by longest output, each led by its shortest
    assert [r.max_output_tokens for r in ranks] == [
        107,
        109,
        108,
        104,
        106,
        105,
        101,
        103,
        102,
        100,
    ]


def test_a_part_sharing_nothing_has_no_leader() -> None:
    requests = [req("x", (), 10, 10), req("y", (), 10, 10)]
    planned = with_plan(requests, plan_job("j", requests, WIDE), "j")
    assert [r.job_leader for r in planned] == [None, None]


def test_budget_is_the_smallest_instance_serving_the_model() -> None:
    a10 = make_profile(gpu_type="A10", max_batch_size=32)
    a100 = make_profile(max_batch_size=64)
    instances = (make_instance("big"), make_instance("small", "A10", memory_gib=24.0))
    fleet = Fleet(instances, {("m7b", "A100"): a100, ("m7b", "A10"): a10})
    budget = job_budget(fleet, "m7b")
    small = a10.kv_capacity_tokens(instances[1].gpu_memory_bytes)
    assert small < a100.kv_capacity_tokens(instances[0].gpu_memory_bytes)
    assert budget == PlanBudget(small, 32)
    assert job_budget(fleet, "no-such-model").max_requests > 10**9


blocks = st.lists(st.integers(0, 5), min_size=0, max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(blocks, st.integers(1, 50), st.integers(1, 300)), min_size=1, max_size=40),
    st.integers(200, 3000),
    st.integers(1, 6),
)
def test_plan_invariants(
    spec: list[tuple[list[int], int, int]], kv_tokens: int, max_requests: int
) -> None:
    requests = []
    for i, (path, own, out) in enumerate(spec):
        keys = tuple((hash(tuple(path[: d + 1])) & 0xFFFF, 40) for d in range(len(path)))
        requests.append(req(f"r{i}", keys, own, out))
    budget = PlanBudget(kv_tokens, max_requests)
    plan = plan_job("j", requests, budget)
    ids = [rid for p in plan.parts for rid in p.request_ids]
    assert sorted(ids) == sorted(r.id for r in requests)  # each request exactly once
    by_id = {r.id: r for r in requests}
    for part in plan.parts:
        assert len(part.request_ids) <= max_requests
        assert len(part.request_ids) == 1 or part.kv_tokens <= kv_tokens
        shared = [by_id[rid].prefix for rid in part.request_ids]
        depth = 0
        for block in shared[0]:  # members share exactly shared_tokens of leading blocks
            if depth >= part.shared_tokens:
                break
            assert all(block in p for p in shared)
            depth += block.tokens
        assert depth == part.shared_tokens
    assert plan_job("j", list(reversed(requests)), budget) == plan  # order-free, deterministic
