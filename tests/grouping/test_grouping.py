"""Grouping policies: the partition contract over every policy, then k-means and exact-key
specifics (the k rule, the split rule, incremental inserts)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qlm.config import GroupingConfig
from qlm.grouping import GROUPING_POLICIES, GroupingPolicy, make_grouping
from qlm.grouping.group import RequestGroup
from qlm.grouping.kmeans import features_of, num_clusters, request_features
from qlm.grouping.partition import RequestColumns, halving_sizes
from qlm.registry import UnknownPolicyError
from qlm.types import Request
from tests.factories import make_request

POLICIES = ("kmeans", "exact-key")


def grouping(policy: str, **fields: object) -> GroupingPolicy:
    return make_grouping(GroupingConfig.model_validate({"policy": policy, **fields}))


def mixed_queue(num_requests: int, seed: int = 0) -> list[Request]:
    """Two models, three SLO classes, spread lengths and arrivals."""
    rng = random.Random(seed)
    ttft_s = {"interactive": 20.0, "batch-1": 60.0, "batch-2": 3600.0}
    requests = []
    for i in range(num_requests):
        slo = rng.choice(list(ttft_s))
        requests.append(
            make_request(
                id=f"q{i}",
                model=rng.choice(["m7b", "m70b"]),
                prompt_tokens=rng.randint(1, 4000),
                max_output_tokens=rng.randint(1, 1000),
                slo_class=slo,
                arrival_at_s=rng.uniform(0.0, 100.0),
                ttft_s=ttft_s[slo],
            )
        )
    return requests


def two_populations(num_each: int) -> tuple[list[Request], list[Request]]:
    """Far apart in every feature: urgent short chats and lax long documents, one model."""
    chats = [
        make_request(id=f"chat{i}", prompt_tokens=50 + i % 7, max_output_tokens=20, ttft_s=5.0)
        for i in range(num_each)
    ]
    documents = [
        make_request(
            id=f"doc{i}",
            prompt_tokens=20_000 + i % 7,
            max_output_tokens=2000,
            slo_class="batch-2",
            ttft_s=3600.0,
        )
        for i in range(num_each)
    ]
    return chats, documents


def assert_partition(groups: Sequence[RequestGroup], requests: Sequence[Request]) -> None:
    """Every request in exactly one group; no group mixes models; ids are unique."""
    by_id = {r.id: r for r in requests}
    placed = Counter(rid for g in groups for rid in g.request_ids)
    assert placed == Counter(r.id for r in requests)
    assert len({g.id for g in groups}) == len(groups)
    for g in groups:
        assert {by_id[rid].model for rid in g.request_ids} == {g.model}


def assert_summaries_exact(groups: Sequence[RequestGroup], requests: Sequence[Request]) -> None:
    """Each summary equals RequestGroup.of over its members (numpy and Python paths agree)."""
    by_id = {r.id: r for r in requests}
    for g in groups:
        assert g == RequestGroup.of(g.id, [by_id[rid] for rid in g.request_ids])


# ---------------------------------------------------------------- the contract, every policy


@pytest.mark.parametrize("policy", POLICIES)
def test_regroup_partitions_by_model_with_exact_summaries(policy: str) -> None:
    requests = mixed_queue(2000)
    groups = grouping(policy, requests_per_cluster=100).regroup(requests, now_s=50.0)
    assert_partition(groups, requests)
    assert_summaries_exact(groups, requests)
    assert {g.model for g in groups} == {"m7b", "m70b"}


@pytest.mark.parametrize("policy", POLICIES)
def test_no_group_exceeds_avg_batch_size_times_delta(policy: str) -> None:
    requests = mixed_queue(3000)
    policy_ = grouping(policy, avg_batch_size=8, delta=2.5)  # max_group_size 20
    groups = policy_.regroup(requests, now_s=50.0)
    assert max(g.size for g in groups) <= 20
    assert sum(g.size for g in groups) == 3000


@pytest.mark.parametrize("policy", POLICIES)
def test_same_inputs_in_any_order_give_identical_groups(policy: str) -> None:
    requests = mixed_queue(1500, seed=3)
    shuffled = random.Random(7).sample(requests, len(requests))
    first = grouping(policy, seed=11).regroup(requests, now_s=40.0)
    second = grouping(policy, seed=11).regroup(shuffled, now_s=40.0)
    assert first == second  # ids, members and member order all equal


@pytest.mark.parametrize("policy", POLICIES)
def test_split_groups_are_deadline_ranges(policy: str) -> None:
    # 300 alike requests in one cluster (k = 1), max 128: halved twice into four parts of 75,
    # earliest deadlines first
    requests = [make_request(id=f"r{i:03}", arrival_at_s=float(i)) for i in range(300)]
    policy_ = grouping(policy, avg_batch_size=32, delta=4.0, requests_per_cluster=1000)
    groups = policy_.regroup(requests, now_s=0.0)
    assert [g.size for g in groups] == [75, 75, 75, 75]
    assert [g.request_ids[0] for g in groups] == ["r000", "r075", "r150", "r225"]
    assert [g.ttft_deadline_at_s for g in groups] == [20.0, 95.0, 170.0, 245.0]


@pytest.mark.parametrize("policy", POLICIES)
def test_add_keeps_partition_and_splits_a_full_group_in_half(policy: str) -> None:
    requests = [make_request(id=f"r{i}", arrival_at_s=float(i)) for i in range(4)]
    policy_ = grouping(policy, avg_batch_size=2, delta=2.0)  # max_group_size 4
    (full,) = policy_.regroup(requests, now_s=0.0)
    late = make_request(id="late", arrival_at_s=10.0)
    joined = policy_.add(late)
    groups = policy_.groups()
    assert_partition(groups, [*requests, late])
    assert_summaries_exact(groups, [*requests, late])
    # 5 members > 4: halved into 3 (keeps the id) and 2 (new id, holds the latest deadline)
    assert [(g.id, g.size) for g in groups] == [(full.id, 3), (joined, 2)]
    assert joined != full.id
    assert groups[1].request_ids == ("r3", "late")


@pytest.mark.parametrize("policy", POLICIES)
def test_add_of_a_new_model_makes_its_own_group(policy: str) -> None:
    requests = mixed_queue(200)
    policy_ = grouping(policy)
    policy_.regroup(requests, now_s=50.0)
    stranger = make_request(id="x", model="m405b")
    joined = policy_.add(stranger)
    groups = policy_.groups()
    assert_partition(groups, [*requests, stranger])
    (mine,) = [g for g in groups if g.id == joined]
    assert mine.request_ids == ("x",)  # nothing else of m405b exists to join
    assert joined.startswith("m405b/")


@pytest.mark.parametrize("policy", POLICIES)
def test_add_before_any_regroup(policy: str) -> None:
    policy_ = grouping(policy)
    requests = mixed_queue(50)
    for r in requests:
        policy_.add(r)
    assert_partition(policy_.groups(), requests)
    assert_summaries_exact(policy_.groups(), requests)


@pytest.mark.parametrize("policy", POLICIES)
def test_add_twice_is_an_error(policy: str) -> None:
    policy_ = grouping(policy)
    request = make_request(id="a")
    policy_.add(request)
    with pytest.raises(ValueError, match="'a' is already grouped"):
        policy_.add(request)
    assert [g.size for g in policy_.groups()] == [1]


@pytest.mark.parametrize("policy", POLICIES)
def test_regroup_rejects_duplicate_ids(policy: str) -> None:
    request = make_request(id="dup")
    with pytest.raises(ValueError, match="dup"):
        grouping(policy).regroup([request, request], now_s=0.0)


@pytest.mark.parametrize("policy", POLICIES)
def test_remove(policy: str) -> None:
    requests = [make_request(id=f"r{i}", arrival_at_s=float(i)) for i in range(6)]
    policy_ = grouping(policy, avg_batch_size=1, delta=3.0)  # max 3: two groups of 3
    policy_.regroup(requests, now_s=0.0)
    policy_.remove("r1")
    assert [g.request_ids for g in policy_.groups()] == [("r0", "r2"), ("r3", "r4", "r5")]
    assert policy_.groups()[0].prompt_tokens_mean == 500.0  # summary rebuilt, still exact
    for rid in ("r3", "r4", "r5"):
        policy_.remove(rid)
    assert [g.request_ids for g in policy_.groups()] == [("r0", "r2")]  # empty group dropped
    with pytest.raises(KeyError, match="r1"):
        policy_.remove("r1")  # already gone


@pytest.mark.parametrize("policy", POLICIES)
def test_groups_reuses_unchanged_summaries(policy: str) -> None:
    requests = [
        make_request(id=f"r{i}", model=model) for i, model in enumerate(["a", "a", "b", "b"])
    ]
    policy_ = grouping(policy)
    before = policy_.regroup(requests, now_s=0.0)
    assert policy_.groups() is before  # nothing changed: the same tuple
    policy_.add(make_request(id="a2", model="a"))
    after = policy_.groups()
    assert after[1] is before[1]  # model b untouched: the same summary object
    assert after[0].size == 3


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    ("every", "adds", "expected"),
    [
        (3, 0, False),  # just regrouped
        (3, 2, False),  # below the threshold
        (3, 3, True),  # threshold reached
        (1, 1, True),  # every insert asks for a rebalance
    ],
)
def test_needs_regroup(policy: str, every: int, adds: int, expected: bool) -> None:
    policy_ = grouping(policy, recluster_every_inserts=every)
    policy_.regroup(mixed_queue(20), now_s=0.0)
    for i in range(adds):
        policy_.add(make_request(id=f"new{i}"))
    assert policy_.needs_regroup is expected
    policy_.regroup(mixed_queue(20), now_s=0.0)
    assert policy_.needs_regroup is False  # a regroup resets the count


@pytest.mark.parametrize("policy", POLICIES)
def test_empty_queue(policy: str) -> None:
    assert grouping(policy).regroup([], now_s=0.0) == ()


@pytest.mark.parametrize("policy", POLICIES)
def test_full_ties_are_broken_by_id(policy: str) -> None:
    # same deadline and arrival, given in reverse: ids decide the cut, max size 5
    requests = [make_request(id=f"r{i}") for i in reversed(range(10))]
    policy_ = grouping(policy, avg_batch_size=5, delta=1.0)
    groups = policy_.regroup(requests, now_s=0.0)
    assert [g.request_ids for g in groups] == [
        ("r0", "r1", "r2", "r3", "r4"),
        ("r5", "r6", "r7", "r8", "r9"),
    ]


@pytest.mark.parametrize(
    ("members", "expected"),
    [
        # (slo class, ttft_s, arrival_at_s) per member
        # majority wins
        ([("batch-2", 3600, 0), ("batch-2", 3600, 1), ("interactive", 20, 0)], "batch-2"),
        # 2 against 2: the earliest deadline (20 s) wins although its name sorts last
        (
            [
                ("batch-1", 60, 0),
                ("batch-1", 60, 0),
                ("interactive", 20, 0),
                ("interactive", 20, 1),
            ],
            "interactive",
        ),
        # 2 against 2: batch-1 due at 60-61 s beats interactive due at 80-81 s
        (
            [
                ("interactive", 20, 60),
                ("interactive", 20, 61),
                ("batch-1", 60, 0),
                ("batch-1", 60, 1),
            ],
            "batch-1",
        ),
    ],
)
def test_regroup_summary_slo_class_is_the_dominant_one(
    members: list[tuple[str, float, float]], expected: str
) -> None:
    requests = [
        make_request(id=f"r{i}", slo_class=slo, ttft_s=ttft_s, arrival_at_s=arrival)
        for i, (slo, ttft_s, arrival) in enumerate(members)
    ]
    policy = grouping("kmeans", requests_per_cluster=1000)  # k = 1: one group
    (group,) = policy.regroup(requests, now_s=0.0)
    assert group.slo_class == expected


# ---------------------------------------------------------------- the split rule


@pytest.mark.parametrize(
    ("num_requests", "max_size", "expected"),
    [
        (128, 128, [128]),  # at the limit: untouched
        (129, 128, [65, 64]),  # one over: halved, first half takes the odd one
        (300, 128, [75, 75, 75, 75]),  # halves of 150 still too big: halved again
        (257, 128, [65, 64, 128]),  # 129 | 128: the 129 is halved again, the 128 stays
        (3, 1, [1, 1, 1]),  # max 1: singletons
        (0, 4, [0]),  # nothing to split
    ],
)
def test_halving_sizes(num_requests: int, max_size: int, expected: list[int]) -> None:
    assert halving_sizes(num_requests, max_size) == expected


# ---------------------------------------------------------------- k-means specifics


@pytest.mark.parametrize(
    ("num_requests", "distinct", "per_cluster", "max_clusters", "expected"),
    [
        (1000, 1000, 256, 64, 4),  # ceil(1000 / 256)
        (1000, 1000, 10, 64, 64),  # capped by max_clusters_per_model
        (1000, 3, 10, 64, 3),  # only 3 distinct feature rows
        (256, 256, 256, 64, 1),  # exactly one cluster's worth
        (1, 1, 256, 64, 1),  # a single request
        (0, 0, 256, 64, 1),  # at least 1
    ],
)
def test_num_clusters_rule(
    num_requests: int, distinct: int, per_cluster: int, max_clusters: int, expected: int
) -> None:
    rows = np.array([[float(i % max(distinct, 1)), 1.0, 1.0] for i in range(num_requests)])
    config = GroupingConfig(requests_per_cluster=per_cluster, max_clusters_per_model=max_clusters)
    assert num_clusters(rows.reshape(-1, 3), config) == expected  # reshape: 0 rows stay 2-D


def test_features_are_log1p_of_slack_prompt_and_output_cap() -> None:
    request = make_request(prompt_tokens=999, max_output_tokens=99, arrival_at_s=0.0, ttft_s=20.0)
    overdue = make_request(arrival_at_s=0.0, ttft_s=20.0)
    columns = RequestColumns.of([request, overdue])
    rows = request_features(columns, reference_s=10.0)
    # slack 20 - 10 = 10 s; lengths 999 and 99 tokens
    np.testing.assert_allclose(rows[0], np.log1p([10.0, 999.0, 99.0]))
    np.testing.assert_allclose(features_of(request, 10.0), rows[0])  # one formula
    # past its deadline: slack clips to 0, in both paths
    assert request_features(columns, reference_s=30.0)[1][0] == 0.0
    assert features_of(overdue, 30.0)[0] == 0.0


def test_kmeans_separates_distinct_populations_and_orders_by_urgency() -> None:
    chats, documents = two_populations(300)
    policy = grouping("kmeans", requests_per_cluster=300, avg_batch_size=1000)  # k = 2
    groups = policy.regroup([*documents, *chats], now_s=0.0)
    # one group per population; k0 is the cluster with the least slack (the chats)
    assert [(g.id, g.size, g.request_ids[0][:3]) for g in groups] == [
        ("m7b/k0.0", 300, "cha"),
        ("m7b/k1.0", 300, "doc"),
    ]
    assert [g.slo_class for g in groups] == ["interactive", "batch-2"]


def test_kmeans_add_joins_the_nearest_centroid() -> None:
    chats, documents = two_populations(300)
    policy = grouping("kmeans", requests_per_cluster=300, avg_batch_size=1000)
    policy.regroup([*chats, *documents], now_s=0.0)
    new_doc = make_request(id="doc-new", prompt_tokens=18_000, max_output_tokens=1800, ttft_s=3000)
    new_chat = make_request(id="chat-new", prompt_tokens=40, max_output_tokens=30, ttft_s=8.0)
    assert policy.add(new_doc) == "m7b/k1.0"  # next to the documents, not the chats
    assert policy.add(new_chat) == "m7b/k0.0"
    assert_partition(policy.groups(), [*chats, *documents, new_doc, new_chat])


def test_kmeans_slack_is_measured_from_the_last_regroup() -> None:
    # same lengths; only deadline slack at now_s=0 tells urgent (10 s) from lax (3600 s)
    urgent = [make_request(id=f"u{i}", ttft_s=10.0 + i % 3) for i in range(200)]
    lax = [make_request(id=f"l{i}", ttft_s=3600.0 + i % 3) for i in range(200)]
    policy = grouping("kmeans", requests_per_cluster=200, avg_batch_size=1000)
    groups = policy.regroup([*lax, *urgent], now_s=0.0)
    assert [{rid[0] for rid in g.request_ids} for g in groups] == [{"u"}, {"l"}]
    # arrives later, deadline 12 s after the regroup's reference: urgent
    assert policy.add(make_request(id="u-new", arrival_at_s=5.0, ttft_s=7.0)) == "m7b/k0.0"


def test_kmeans_seed_is_used() -> None:
    requests = mixed_queue(3000, seed=1)
    ids = {
        seed: [g.request_ids for g in grouping("kmeans", seed=seed).regroup(requests, 50.0)]
        for seed in (0, 0, 1)
    }
    # seeds 0 and 1 start k-means++ differently; with 3000 spread requests they disagree
    assert ids[0] != ids[1]


# ---------------------------------------------------------------- exact-key specifics


def test_exact_key_one_group_per_model_and_slo_class() -> None:
    requests = mixed_queue(400)
    groups = grouping("exact-key", avg_batch_size=1000).regroup(requests, now_s=0.0)
    expected = sorted({(r.model, r.slo_class) for r in requests})  # 2 models x 3 classes
    assert [(g.model, g.slo_class) for g in groups] == expected
    assert [g.id for g in groups] == [f"{m}/{c}.0" for m, c in expected]
    by_id = {r.id: r for r in requests}
    for g in groups:
        assert {by_id[rid].slo_class for rid in g.request_ids} == {g.slo_class}


def test_exact_key_add_goes_to_its_class() -> None:
    policy = grouping("exact-key")
    policy.regroup(mixed_queue(100), now_s=0.0)
    request = make_request(id="b", model="m70b", slo_class="batch-1", ttft_s=60.0)
    assert policy.add(request) == "m70b/batch-1.0"


# ---------------------------------------------------------------- the registry


def test_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPolicyError) as caught:
        make_grouping(GroupingConfig(policy="hdbscan"))
    assert str(caught.value) == "unknown grouping policy 'hdbscan'; known: exact-key, kmeans"
    assert set(POLICIES) <= set(GROUPING_POLICIES.names())


# ---------------------------------------------------------------- properties


_request_fields = st.tuples(
    st.sampled_from(["a", "b", "c"]),  # model
    st.sampled_from([("interactive", 20.0), ("batch-1", 60.0), ("batch-2", 3600.0)]),
    st.integers(1, 5000),  # prompt tokens
    st.integers(1, 2000),  # output cap
    st.floats(0.0, 1000.0),  # arrival
)


def _requests(fields: list[tuple[str, tuple[str, float], int, int, float]]) -> list[Request]:
    return [
        make_request(
            id=f"p{i}",
            model=model,
            slo_class=slo,
            ttft_s=ttft_s,
            prompt_tokens=prompt,
            max_output_tokens=output,
            arrival_at_s=arrival,
        )
        for i, (model, (slo, ttft_s), prompt, output, arrival) in enumerate(fields)
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(POLICIES),
    fields=st.lists(_request_fields, max_size=300),
    max_group_size=st.integers(1, 40),
    per_cluster=st.integers(1, 50),
    num_added=st.integers(0, 60),
    remove_every=st.integers(2, 7),
)
def test_every_request_in_exactly_one_group_of_bounded_size(
    policy: str,
    fields: list[tuple[str, tuple[str, float], int, int, float]],
    max_group_size: int,
    per_cluster: int,
    num_added: int,
    remove_every: int,
) -> None:
    requests = _requests(fields)
    queued, arriving = requests[num_added:], requests[:num_added]
    policy_ = grouping(
        policy, avg_batch_size=max_group_size, delta=1.0, requests_per_cluster=per_cluster
    )
    policy_.regroup(queued, now_s=500.0)
    for r in arriving:
        policy_.add(r)
    removed = {r.id for r in requests[::remove_every]}
    for rid in sorted(removed):
        policy_.remove(rid)
    live = [r for r in requests if r.id not in removed]
    groups = policy_.groups()
    assert_partition(groups, live)
    assert_summaries_exact(groups, live)
    assert all(g.size <= max_group_size for g in groups)
