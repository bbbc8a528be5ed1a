"""The pure reconcile step: virtual queue + engine state -> LSOs, rule by rule."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qlm.agents.actions import Evict, KvDirection, LoadModel, Pull, SwapKv, lso_steps
from qlm.agents.reconcile import (
    QueuedGroup,
    QueuedItem,
    ReconcileConfig,
    ReconcileInput,
    reconcile,
)
from qlm.engine.engine_types import EngineObservation, EngineRequest, EngineState

PRIORITY = {"interactive": 2, "batch-1": 1, "batch-2": 0}


def obs(
    *,
    model: str | None = "a",
    state: EngineState = EngineState.READY,
    running: Sequence[EngineRequest] = (),
    max_num_seqs: int = 4,
    kv_capacity: int = 10_000,
    kv_swap: bool = False,
) -> EngineObservation:
    used = sum(r.context_tokens for r in running if not r.kv_on_cpu)
    return EngineObservation(
        instance_id="i0",
        state=state,
        model=model,
        requests=tuple(running),
        kv_used_tokens=used,
        kv_capacity_tokens=kv_capacity,
        max_num_seqs=max_num_seqs,
        supports_kv_swap=kv_swap,
    )


def running(rid: str, slo: str = "batch-2", out: int = 10, on_cpu: bool = False) -> EngineRequest:
    return EngineRequest(rid, slo, 100, 200, out, True, on_cpu)


def group(
    gid: str, n: int, model: str = "a", slo: str = "batch-2", prompt: int = 100
) -> QueuedGroup:
    items = tuple(QueuedItem(f"{gid}.{i}", prompt, 50) for i in range(n))
    return QueuedGroup(gid, model, slo, items)


def run(o: EngineObservation, *queue: QueuedGroup, **opts: bool | int) -> tuple[object, ...]:
    return reconcile(ReconcileInput(o, tuple(queue), PRIORITY), ReconcileConfig(**opts))


def test_pulls_in_plan_order_up_to_free_slots() -> None:
    actions = run(obs(running=[running("x")]), group("g1", 2), group("g2", 5))
    assert actions == (Pull("i0", ("g1.0", "g1.1", "g2.0")),)


def test_an_engine_backlog_admits_beyond_the_sequence_slots() -> None:
    full = obs(running=[running(f"x{i}") for i in range(4)])
    assert run(full, group("g1", 5)) == ()
    assert run(full, group("g1", 5), engine_backlog=2) == (Pull("i0", ("g1.0", "g1.1")),)
    waiting = obs(running=[running(f"x{i}") for i in range(5)])  # one already waits inside
    assert run(waiting, group("g1", 5), engine_backlog=2) == (Pull("i0", ("g1.0",)),)
    tight = obs(running=[running(f"x{i}") for i in range(4)], kv_capacity=1_300)
    assert run(tight, group("g1", 5), engine_backlog=2) == ()  # KV still bounds admission
    # An urgent request does not wait behind batch work inside the engine: it preempts, and
    # what waits in the engine goes first, then enough running work to free a sequence.
    parked = [running(f"x{i}") for i in range(4)] + [running("w", out=0)._replace(started=False)]
    urgent = run(obs(running=parked), group("g1", 1, slo="interactive"), engine_backlog=2)
    assert urgent[0] == Evict("i0", ("w", "x0"), urgent[0].reason, ("g1.0",))  # type: ignore[union-attr]
    assert urgent[1] == Pull("i0", ("g1.0",))


def test_pull_stops_at_kv_room() -> None:
    # 1,000 tokens free. By default each request reserves its 300-token prompt and its
    # 50-token output cap; with reserve_full_output off, the prompt + 16 tokens.
    actions = run(obs(kv_capacity=1_000), group("g1", 5, prompt=300))
    assert actions == (Pull("i0", ("g1.0", "g1.1")),)
    actions = run(obs(kv_capacity=1_000), group("g1", 5, prompt=300), reserve_full_output=False)
    assert actions == (Pull("i0", ("g1.0", "g1.1", "g1.2")),)


def test_running_requests_reserve_their_output_cap() -> None:
    # One running request: 110 tokens now, 300 at its cap; 500 tokens of capacity.
    o = obs(running=[running("x", out=10)], kv_capacity=500)
    assert run(o, group("g1", 2, prompt=100)) == (Pull("i0", ("g1.0",)),)


def test_an_empty_engine_takes_one_request_larger_than_its_kv() -> None:
    assert run(obs(kv_capacity=10), group("g1", 2, prompt=100)) == (Pull("i0", ("g1.0",)),)


def test_never_pulls_past_a_model_switch() -> None:
    actions = run(obs(), group("g1", 1), group("g2", 3, model="b"), group("g3", 3))
    assert actions == (Pull("i0", ("g1.0",)),)


@pytest.mark.parametrize("state", [EngineState.LOADING, EngineState.FAILED])
def test_loading_or_failed_engine_gets_nothing(state: EngineState) -> None:
    assert run(obs(state=state), group("g1", 3)) == ()


def test_head_of_other_model_on_empty_engine_loads_it() -> None:
    assert run(obs(model="a"), group("g1", 2, model="b")) == (LoadModel("i0", "b"),)
    assert run(obs(model=None, state=EngineState.EMPTY), group("g1", 2)) == (LoadModel("i0", "a"),)


def test_swap_waits_for_equal_priority_work_to_drain() -> None:
    o = obs(running=[running("x", "batch-2")])
    assert run(o, group("g1", 2, model="b", slo="batch-2")) == ()


def test_urgent_head_of_other_model_evicts_then_swaps() -> None:
    o = obs(running=[running("x", "batch-2"), running("y", "batch-1")])
    actions = run(o, group("g1", 2, model="b", slo="interactive"))
    assert len(actions) == 2
    evict, load = actions
    assert isinstance(evict, Evict)
    assert set(evict.request_ids) == {"x", "y"}
    assert load == LoadModel("i0", "b")


def test_no_model_swap_skips_groups_of_other_models() -> None:
    actions = run(obs(), group("g1", 2, model="b"), group("g2", 1), allow_model_swap=False)
    assert actions == (Pull("i0", ("g2.0",)),)


def test_blocked_urgent_group_evicts_lowest_priority_least_progress_first() -> None:
    full = [
        running("b2-old", "batch-2", out=150),
        running("b2-new", "batch-2", out=5),
        running("b1", "batch-1", out=1),
        running("int", "interactive", out=1),
    ]
    actions = run(obs(running=full), group("g1", 1, slo="interactive"))
    assert actions == (
        Evict("i0", ("b2-new",), "group g1 (interactive) blocked", ("g1.0",)),
        Pull("i0", ("g1.0",)),
    )


def test_eviction_frees_room_for_the_whole_head_group() -> None:
    full = [running(f"b{i}", "batch-2", out=i) for i in range(4)]
    actions = run(obs(running=full), group("g1", 3, slo="interactive"))
    evict, pull = actions
    assert isinstance(evict, Evict)
    assert evict.request_ids == ("b0", "b1", "b2")
    assert evict.for_request_ids == ("g1.0", "g1.1", "g1.2")  # the agent claims these first
    assert pull == Pull("i0", ("g1.0", "g1.1", "g1.2"))


def test_no_eviction_for_equal_priority_or_when_disabled() -> None:
    full = [running(f"b{i}", "interactive") for i in range(4)]
    assert run(obs(running=full), group("g1", 1, slo="interactive")) == ()
    lows = [running(f"b{i}", "batch-2") for i in range(4)]
    assert run(obs(running=lows), group("g1", 1, slo="interactive"), allow_evict=False) == ()


def test_kv_swap_replaces_eviction_when_the_engine_supports_it() -> None:
    full = [running(f"b{i}", "batch-2", out=i) for i in range(4)]
    actions = run(obs(running=full, kv_swap=True), group("g1", 1, slo="interactive"))
    assert actions[0] == SwapKv("i0", ("b0",), KvDirection.TO_CPU, ("g1.0",))


def test_swapped_requests_return_when_nothing_queued_outranks_them() -> None:
    o = obs(running=[running("s", "batch-2", on_cpu=True)], kv_swap=True)
    assert run(o) == (SwapKv("i0", ("s",), KvDirection.TO_GPU),)
    # A queued interactive group that is pulled first keeps the swapped request out.
    assert run(o, group("g1", 1, slo="interactive")) == (Pull("i0", ("g1.0",)),)


@given(
    n_running=st.integers(0, 6),
    sizes=st.lists(st.integers(0, 5), min_size=0, max_size=4),
    slots=st.integers(1, 8),
    kv=st.integers(0, 3_000),
    classes=st.lists(st.sampled_from(sorted(PRIORITY)), min_size=4, max_size=4),
    models=st.lists(st.sampled_from(["a", "b"]), min_size=4, max_size=4),
)
def test_actions_respect_the_engine_budget(
    n_running: int,
    sizes: list[int],
    slots: int,
    kv: int,
    classes: list[str],
    models: list[str],
) -> None:
    rs = [running(f"r{i}", classes[i % 4], out=i) for i in range(n_running)]
    o = obs(running=rs, max_num_seqs=max(slots, n_running), kv_capacity=kv + 310 * n_running)
    queue = [group(f"g{i}", n, models[i], classes[i]) for i, n in enumerate(sizes)]
    actions = run(o, *queue)
    evicted: set[str] = set()
    pulled: list[str] = []
    for a in actions:
        if isinstance(a, Evict):
            evicted |= set(a.request_ids)
        elif isinstance(a, Pull):
            pulled += a.request_ids
        elif isinstance(a, LoadModel):
            assert all(r.request_id in evicted for r in rs)  # a swap empties the engine first
    queued_ids = {it.request_id for g in queue for it in g.items}
    assert set(pulled) <= queued_ids
    assert len(pulled) == len(set(pulled))
    assert evicted <= {r.request_id for r in rs}
    remaining = [r for r in rs if r.request_id not in evicted]
    assert len(remaining) + len(pulled) <= o.max_num_seqs
    kv_after = sum(max(r.context_tokens, 300) for r in remaining) + 150 * len(pulled)
    lone = not remaining and len(pulled) == 1  # an empty engine always takes one
    assert not pulled or lone or kv_after <= o.kv_capacity_tokens
    # Room freed by preempting goes to more urgent work only (else evict and pull in turn).
    rank = {it.request_id: PRIORITY[g.class_of(it)] for g in queue for it in g.items}
    victims = [PRIORITY[r.slo_class] for r in rs if r.request_id in evicted]
    if victims:
        assert all(rank[rid] > max(victims) for rid in pulled)


def test_members_rank_by_their_own_class_in_a_mixed_group() -> None:
    """A batch member of a group labelled interactive must not evict batch work (no thrash),
    while the group's interactive member still does, and is pulled first."""
    full = [running(f"b{i}", "batch-2", out=i) for i in range(4)]
    mixed = QueuedGroup(
        "g1",
        "a",
        "interactive",
        (QueuedItem("late-batch", 100, 50, "batch-2"), QueuedItem("chat", 100, 50, "interactive")),
    )
    only_batch = QueuedGroup(
        "g1", "a", "interactive", (QueuedItem("late-batch", 100, 50, "batch-2"),)
    )
    assert run(obs(running=full), only_batch) == ()
    evict, pull = run(obs(running=full), mixed)
    assert isinstance(evict, Evict)
    assert evict.request_ids == ("b0",)
    assert pull == Pull("i0", ("chat",))


def test_no_eviction_that_cannot_seat_the_urgent_request_and_no_pull_into_freed_room() -> None:
    """An urgent prompt too large for the KV that evicting could free evicts nothing; and the
    room a preemption frees never goes to work ranked like its victims. (A simulator run
    evicted a batch request for an interactive one that still did not fit, pulled another
    batch request into the freed room, and did the same again with the two swapped, forever
    at one instant.)"""
    engine = [running("int", "interactive"), EngineRequest("b-old", "batch-1", 300, 100, 0, False)]
    queue = QueuedGroup(
        "g",
        "a",
        "interactive",
        (QueuedItem("b-new", 100, 50, "batch-1"), QueuedItem("huge", 5_000, 50, "interactive")),
    )
    assert run(obs(running=engine, max_num_seqs=2, kv_capacity=1_000), queue) == ()
    seated = QueuedGroup(
        "g",
        "a",
        "interactive",
        (QueuedItem("b-new", 100, 50, "batch-1"), QueuedItem("chat", 300, 50, "interactive")),
    )
    evict, pull = run(obs(running=engine, max_num_seqs=2, kv_capacity=1_000), seated)
    assert isinstance(evict, Evict)
    assert evict.request_ids == ("b-old",)
    assert pull == Pull("i0", ("chat",))


def test_a_load_of_the_model_loading_or_served_is_no_step() -> None:
    """`lso_steps`, both planes: a second LoadModel of the model an engine loads already (two
    steps of one instance in one round) is no swap (the simulator counted it as one), a
    LoadModel of its model when loaded is none either, and another model's evicts first."""
    load_b = LoadModel("i0", "b")
    assert lso_steps([load_b, load_b], ("r1",), "a") == (
        Evict("i0", ("r1",), "model swap to b"),
        load_b,
    )
    assert lso_steps([load_b], (), "b") == ()  # loading b, or serving it
    assert lso_steps([load_b, LoadModel("i0", "a")], (), "a") == (
        load_b,
        LoadModel("i0", "a"),
    )
