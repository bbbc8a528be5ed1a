"""Preemption with the engine's timing (reconcile rule 4, `ReconcileInput.timing`): it waits
when room frees on its own in time, and evicts only for the head's members that would miss
otherwise, never every lower-priority request because the head group is long (a model's
whole dispatch queue is one group)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from qlm.agents.actions import Evict, Pull
from qlm.agents.reconcile import (
    EngineTiming,
    QueuedGroup,
    QueuedItem,
    ReconcileConfig,
    ReconcileInput,
    reconcile,
)
from qlm.engine.engine_types import EngineObservation, EngineRequest, EngineState

PRIORITY = {"interactive": 2, "batch-1": 1, "batch-2": 0}
TIMING = EngineTiming(now_s=0.0, decode_step_s=0.01, prefill_tokens_per_s=100_000.0)


def engine(running: list[EngineRequest], seqs: int = 4) -> EngineObservation:
    used = sum(r.context_tokens for r in running)
    return EngineObservation("i0", EngineState.READY, "a", tuple(running), used, 100_000, seqs)


def batch(rid: str, done_tokens: int) -> EngineRequest:
    """A started batch-2 request of 200 output tokens, `done_tokens` of them made."""
    return EngineRequest(rid, "batch-2", 100, 200, done_tokens, True)


def chats(deadlines_s: list[float]) -> QueuedGroup:
    items = tuple(
        QueuedItem(f"c{i}", 100, 50, "interactive", due_s) for i, due_s in enumerate(deadlines_s)
    )
    return QueuedGroup("dispatch:a", "a", "interactive", items)


def step(
    obs: EngineObservation, queue: QueuedGroup, timing: EngineTiming | None = TIMING
) -> tuple[object, ...]:
    return reconcile(ReconcileInput(obs, (queue,), PRIORITY, timing), ReconcileConfig())


def test_no_preemption_when_room_frees_in_time() -> None:
    # One batch request ends in 5 decode steps (0.05 s): the first chat, due at 1 s, waits.
    full = [batch("near", 195), batch("b1", 0), batch("b2", 0), batch("b3", 0)]
    assert step(engine(full), chats([1.0, 100.0])) == ()
    assert step(engine(full), chats([1.0, 100.0]), timing=None) != ()  # blind: it preempts


def test_evicts_only_for_the_members_that_would_miss() -> None:
    """Every batch request ends in 2 s. Two chats are due at 1 s, eight at 100 s: two
    victims seat the two, and the eight wait for room to free (without timing: all four)."""
    full = [batch(f"b{i}", i) for i in range(4)]
    queue = chats([1.0, 1.0] + [100.0] * 8)
    evict, pull = step(engine(full), queue)
    assert isinstance(evict, Evict)
    assert evict.request_ids == ("b0", "b1")  # least progress first
    assert pull == Pull("i0", ("c0", "c1"))
    blind_evict, _ = step(engine(full), queue, timing=None)
    assert isinstance(blind_evict, Evict)
    assert len(blind_evict.request_ids) == 4


@given(
    done=st.lists(st.integers(0, 200), min_size=1, max_size=6),
    deadlines=st.lists(st.floats(0.0, 5.0), min_size=1, max_size=8),
    seqs=st.integers(1, 6),
)
def test_never_evicts_more_than_the_timing_blind_rule(
    done: list[int], deadlines: list[float], seqs: int
) -> None:
    full = [batch(f"b{i}", d) for i, d in enumerate(done)]
    obs = engine(full, seqs=max(seqs, len(full)))
    queue = chats(deadlines)

    def evicted(actions: tuple[object, ...]) -> set[str]:
        return {rid for a in actions if isinstance(a, Evict) for rid in a.request_ids}

    timed, blind = evicted(step(obs, queue)), evicted(step(obs, queue, timing=None))
    assert timed <= blind
