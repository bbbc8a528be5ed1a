"""`room`: what an engine takes now, as reconcile counts it. The simulator's dispatch skips an
instance whose room does not take the request first in line, so the two must agree."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from qlm.agents.actions import Pull
from qlm.agents.reconcile import (
    EngineTiming,
    QueuedGroup,
    QueuedItem,
    ReconcileConfig,
    ReconcileInput,
    reconcile,
)
from qlm.agents.room import room
from qlm.engine.engine_types import EngineObservation, EngineRequest, EngineState

PRIORITY = {"interactive": 1, "batch": 0}


def engine(admitted: list[tuple[int, bool]], max_num_seqs: int, kv: int) -> EngineObservation:
    """An engine holding requests of (prompt tokens, started)."""
    requests = tuple(
        EngineRequest(f"r{i}", "batch", prompt, 64, 1 if started else 0, started, False)
        for i, (prompt, started) in enumerate(admitted)
    )
    return EngineObservation(
        instance_id="i0",
        state=EngineState.READY,
        model="m",
        requests=requests,
        kv_used_tokens=sum(r.context_tokens for r in requests),
        kv_capacity_tokens=kv,
        max_num_seqs=max_num_seqs,
        supports_kv_swap=False,
    )


@given(
    admitted=st.lists(st.tuples(st.integers(1, 4000), st.booleans()), max_size=6),
    max_num_seqs=st.integers(1, 8),
    kv=st.integers(1000, 40_000),
    prompt=st.integers(1, 6000),
    output=st.integers(1, 2000),
    reserve_full=st.booleans(),
    backlog_s=st.sampled_from([None, 0.5, 1.0]),
    slo_class=st.sampled_from(["interactive", "batch"]),
    deadline_s=st.floats(0.0, 12.0),
)
def test_reconcile_pulls_the_head_exactly_when_room_takes_it(
    admitted: list[tuple[int, bool]],
    max_num_seqs: int,
    kv: int,
    prompt: int,
    output: int,
    reserve_full: bool,
    backlog_s: float | None,
    slo_class: str,
    deadline_s: float,
) -> None:
    obs = engine(admitted, max(max_num_seqs, len(admitted)), kv)
    timing = EngineTiming(
        1.0, decode_step_s=0.02, prefill_tokens_per_s=2000.0, prefill_beside_tokens_per_s=1500.0
    )
    options = ReconcileConfig(
        allow_evict=False, reserve_full_output=reserve_full, prefill_backlog_s=backlog_s
    )
    head = QueuedItem("new", prompt, output, slo_class, deadline_s)
    queue = (QueuedGroup("g", "m", "", (head,)),)
    actions = reconcile(ReconcileInput(obs, queue, PRIORITY, timing), options)
    assert (Pull("i0", ("new",)) in actions) == room(obs, timing, PRIORITY, options).takes(head)


def test_a_full_prefill_queue_takes_no_prompt_until_one_starts() -> None:
    timing = EngineTiming(now_s=0.0, decode_step_s=0.02, prefill_tokens_per_s=1000.0)
    queued_1500 = engine([(1500, False), (300, True)], 8, 100_000)
    small = QueuedItem("s", 1, 10)
    assert not room(queued_1500, timing, PRIORITY).takes(small)  # 1.5 s queued, 1 s allowed
    started = engine([(1500, True), (300, True)], 8, 100_000)
    assert room(started, timing, PRIORITY).takes(QueuedItem("big", 50_000, 10))
    assert room(engine([(600, False)], 8, 100_000), timing, PRIORITY).prompt_tokens == 400


def test_the_most_urgent_class_passes_a_full_prefill_queue_when_its_deadline_allows() -> None:
    timing = EngineTiming(now_s=10.0, decode_step_s=0.02, prefill_tokens_per_s=1000.0)
    mega = engine([(5000, False)], 8, 100_000)  # 5 s of prefill queued, 1 s allowed
    r = room(mega, timing, PRIORITY)
    # first token at 10 + 5 + 0.5 s
    assert r.takes(QueuedItem("i", 500, 10, "interactive", ttft_deadline_at_s=15.5))
    assert not r.takes(QueuedItem("late", 500, 10, "interactive", ttft_deadline_at_s=15.4))
    assert not r.takes(QueuedItem("b", 500, 10, "batch", ttft_deadline_at_s=1e9))


def test_a_prompt_without_prefill_room_holds_back_its_class_but_not_a_more_urgent_one() -> None:
    timing = EngineTiming(now_s=0.0, decode_step_s=0.02, prefill_tokens_per_s=1000.0)
    obs = engine([(5000, False)], 8, 100_000)
    line = (
        QueuedItem("big-batch", 3000, 10, "batch", 60.0),
        QueuedItem("small-batch", 10, 10, "batch", 61.0),
        QueuedItem("chat", 200, 10, "interactive", 20.0),
        QueuedItem("chat-too-late", 200, 10, "interactive", 5.0),
        QueuedItem("chat-2", 200, 10, "interactive", 21.0),
    )
    queue = (QueuedGroup("dispatch", "m", "", line, in_order=True),)
    options = ReconcileConfig(allow_evict=False)
    actions = reconcile(ReconcileInput(obs, queue, PRIORITY, timing), options)
    assert actions == (Pull("i0", ("chat", "chat-2")),)
    r = room(obs, timing, PRIORITY, options)
    assert not r.blocks(queue, PRIORITY)  # only the prefill bound stops the head
    assert r.holds(line[0])
    assert not r.takes(line[0])


@given(
    admitted=st.lists(st.tuples(st.integers(1, 4000), st.booleans()), max_size=6),
    max_num_seqs=st.integers(1, 8),
    kv=st.integers(1000, 40_000),
    line=st.lists(
        st.tuples(
            st.integers(1, 6000),
            st.integers(1, 2000),
            st.sampled_from(["interactive", "batch"]),
            st.floats(0.0, 12.0),
        ),
        min_size=1,
        max_size=4,
    ),
    backlog_s=st.sampled_from([None, 0.5, 1.0]),
)
def test_room_blocks_only_when_reconcile_does_nothing(
    admitted: list[tuple[int, bool]],
    max_num_seqs: int,
    kv: int,
    line: list[tuple[int, int, str, float]],
    backlog_s: float | None,
) -> None:
    """The simulator skips an engine whose room blocks its queue, and offers arrivals only to
    engines whose room does not stop at the request first in line: neither may leave out
    an engine that would pull (a request behind the first may pass it)."""
    obs = engine(admitted, max(max_num_seqs, len(admitted)), kv)
    timing = EngineTiming(
        1.0, 0.02, prefill_tokens_per_s=2000.0, prefill_beside_tokens_per_s=1500.0
    )
    options = ReconcileConfig(allow_evict=False, prefill_backlog_s=backlog_s)
    items = tuple(
        QueuedItem(f"q{i}", prompt, output, cls, deadline)
        for i, (prompt, output, cls, deadline) in enumerate(line)
    )
    queue = (QueuedGroup("dispatch", "m", "", items, in_order=True),)
    r = room(obs, timing, PRIORITY, options)
    pulls = list(reconcile(ReconcileInput(obs, queue, PRIORITY, timing), options))
    if r.blocks(queue, PRIORITY) or r.stops(items[0]):
        assert pulls == []


def test_a_first_request_without_kv_or_prefill_room_does_not_block_the_one_behind() -> None:
    timing = EngineTiming(0.0, decode_step_s=0.02, prefill_tokens_per_s=1000.0)
    obs = engine([(3000, False)], 8, 10_000)  # 3 s of prefill queued; 7,000 tokens of KV free
    big = QueuedItem("big", 9000, 100, "batch", 60.0)  # neither KV nor prefill room
    chat = QueuedItem("chat", 100, 100, "interactive", 20.0)
    queue = (QueuedGroup("dispatch", "m", "", (big, chat), in_order=True),)
    options = ReconcileConfig(allow_evict=False)
    actions = reconcile(ReconcileInput(obs, queue, PRIORITY, timing), options)
    assert actions == (Pull("i0", ("chat",)),)
    r = room(obs, timing, PRIORITY, options)
    assert not r.stops(big)
    assert not r.blocks(queue, PRIORITY)
