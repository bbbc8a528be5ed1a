"""Miss causes from hand-built outcomes: each cause, and the precedence between them (the first
that applies wins; among the four shares of the wait, the largest)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qlm.sim.miss_causes import MissCause, miss_cause, miss_cause_counts
from qlm.sim.result import OutcomeState, RequestOutcome

END_S = 1000.0  # when the run ended


def outcome(**changes: object) -> RequestOutcome:
    """By default: arrived at 0, TTFT deadline 20, no completion deadline, dispatched at 30
    after 30 s in the queue with its model loaded somewhere, first token at 35, done at 40."""
    base = RequestOutcome(
        request_id="r",
        slo_class="interactive",
        model="m7b",
        instance_id="i0",
        arrival_s=0.0,
        dispatch_s=30.0,
        first_token_s=35.0,
        finish_s=40.0,
        ttft_deadline_s=20.0,
        completion_deadline_s=None,
        evictions=0,
        state=OutcomeState.COMPLETED,
        queue_wait_s=30.0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def cause(**changes: object) -> MissCause | None:
    return miss_cause(outcome(**changes), END_S)


def test_a_request_that_met_its_slo_has_no_cause() -> None:
    assert cause(dispatch_s=1.0, first_token_s=2.0, queue_wait_s=1.0) is None
    assert cause(first_token_s=20.0, completion_deadline_s=40.0) is None  # both on the dot


def test_failed_comes_first() -> None:
    assert cause(state=OutcomeState.FAILED, interrupted_s=1.0, first_token_s=None) == "failed"


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # no first token; the run ended before the TTFT deadline: undecided
        ({"first_token_s": None, "finish_s": None, "ttft_deadline_s": 2000.0}, "unfinished"),
        # no first token and the deadline passed: why it waited (here: the queue)
        (
            {"first_token_s": None, "finish_s": None, "queue_wait_s": 900.0, "dispatch_s": 900.0},
            "queued",
        ),
        # first token on time, no completion deadline: only the run's end stopped it
        ({"first_token_s": 10.0, "finish_s": None}, "unfinished"),
        # first token on time, completion deadline still ahead at the end
        ({"first_token_s": 10.0, "finish_s": None, "completion_deadline_s": 2000.0}, "unfinished"),
        # first token on time, completion deadline passed before the end: decoding was slow
        ({"first_token_s": 10.0, "finish_s": None, "completion_deadline_s": 500.0}, "slow_decode"),
        # a late first token, then the run ended: the lateness is already decided
        ({"finish_s": None}, "queued"),
    ],
)
def test_unfinished_only_when_the_run_ended_before_the_miss(
    changes: dict[str, object], expected: str
) -> None:
    assert cause(state=OutcomeState.UNFINISHED, **changes) == expected


def test_evicted_when_let_go_before_the_first_token_or_after_an_on_time_one() -> None:
    assert cause(interrupted_s=31.0, first_token_s=50.0) == "evicted"
    never = {"first_token_s": None, "finish_s": None, "state": OutcomeState.UNFINISHED}
    assert cause(interrupted_s=31.0, **never) == "evicted"
    # An on-time first token, then evicted, finished after the completion deadline.
    late_finish = {"first_token_s": 10.0, "completion_deadline_s": 30.0}
    assert cause(interrupted_s=12.0, **late_finish) == "evicted"
    assert cause(**late_finish) == "slow_decode"


def test_an_eviction_after_a_late_first_token_is_not_the_cause() -> None:
    assert cause(interrupted_s=36.0) == "queued"


@pytest.mark.parametrize(
    ("no_model_s", "load_s", "queue_s", "first_token_s", "expected"),
    [
        (20.0, 5.0, 30.0, 35.0, "no_instance"),  # 20 no model, 5 loading, 5 queued, 5 engine
        (5.0, 20.0, 30.0, 35.0, "model_load"),
        (5.0, 5.0, 30.0, 35.0, "queued"),  # 20 queued with the model loaded
        (5.0, 5.0, 12.0, 35.0, "in_engine"),  # 23 s between dispatch and first token
        (10.0, 10.0, 30.0, 40.0, "no_instance"),  # a four-way tie: the first listed
        (0.0, 15.0, 30.0, 45.0, "model_load"),  # a tie between the last three shares
    ],
)
def test_a_late_first_token_goes_to_the_largest_share_of_the_wait(
    no_model_s: float, load_s: float, queue_s: float, first_token_s: float, expected: str
) -> None:
    late = outcome(
        no_model_wait_s=no_model_s,
        load_wait_s=load_s,
        queue_wait_s=queue_s,
        dispatch_s=queue_s,
        first_token_s=first_token_s,
    )
    assert miss_cause(late, END_S) == expected


def test_without_a_first_token_the_wait_runs_to_the_end_of_the_run() -> None:
    # Dispatched at 30 and still without a token at the end (1000): the engine held it.
    never = outcome(state=OutcomeState.UNFINISHED, first_token_s=None, finish_s=None)
    assert miss_cause(never, END_S) == "in_engine"
    # Never dispatched, its model on no instance all along.
    ghost = replace(never, dispatch_s=None, queue_wait_s=END_S, no_model_wait_s=END_S)
    assert miss_cause(ghost, END_S) == "no_instance"


def test_counts_list_every_cause_in_precedence_order() -> None:
    outcomes = [
        outcome(),
        outcome(state=OutcomeState.FAILED),
        outcome(first_token_s=1.0, dispatch_s=1.0, queue_wait_s=1.0),  # met
        outcome(queue_wait_s=0.0, dispatch_s=0.0),
    ]
    counts = miss_cause_counts(outcomes, END_S)
    assert list(counts) == [str(c) for c in MissCause]
    assert list(counts)[:3] == ["failed", "unfinished", "evicted"]
    assert counts == {**dict.fromkeys(counts, 0), "queued": 1, "failed": 1, "in_engine": 1}
