"""The live plane's miss causes: what an agent knew of an ended request (its result) gives the
cause the shared classifier (qlm/causes/classify.py) assigns, and the recorder counts it."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from qlm.causes import MissCause
from qlm.causes.live import LIVE_CAUSES, overlap_s, result_cause, result_facts
from qlm.clock import VirtualClock
from qlm.metrics import PlaneMetrics
from qlm.queue.records import RequestResult
from qlm.types import Request, RequestState
from tests.factories import make_request


def ended(
    request: Request,
    *,
    dispatched_s: float,
    first_s: float | None,
    finished_s: float,
    state: RequestState = RequestState.COMPLETED,
    attempt: int = 1,
    load_wait_s: float = 0.0,
) -> RequestResult:
    return RequestResult(
        request.id,
        state,
        "i0",
        dispatched_at_s=dispatched_s,
        first_token_at_s=first_s,
        finished_at_s=finished_s,
        attempt=attempt,
        load_wait_s=load_wait_s,
    )


def test_a_request_that_met_its_slo_has_no_cause() -> None:
    r = make_request(arrival_at_s=100.0, ttft_s=2.0, completion_s=10.0)
    assert result_cause(r, ended(r, dispatched_s=100.5, first_s=101.0, finished_s=109.0)) is None


def test_a_long_queue_wait_then_a_quick_first_token_is_queued() -> None:
    r = make_request(arrival_at_s=100.0, ttft_s=2.0)
    result = ended(r, dispatched_s=130.0, first_s=130.1, finished_s=131.0)
    assert result_cause(r, result) is MissCause.QUEUED
    facts = result_facts(r, result)
    assert facts.queue_wait_s == pytest.approx(30.0)
    assert facts.interrupted_s is None
    assert facts.no_model_wait_s == 0.0  # one agent cannot know it


def test_dispatched_at_once_then_waiting_in_the_engine_is_in_engine() -> None:
    r = make_request(arrival_at_s=100.0, ttft_s=2.0)
    result = ended(r, dispatched_s=100.05, first_s=115.0, finished_s=116.0)
    assert result_cause(r, result) is MissCause.IN_ENGINE


def test_a_request_let_go_before_its_last_dispatch_is_evicted() -> None:
    r = make_request(arrival_at_s=100.0, ttft_s=2.0)
    # Same times as a queued miss, but its second attempt ended it.
    result = ended(r, dispatched_s=130.0, first_s=130.1, finished_s=131.0, attempt=2)
    assert result_cause(r, result) is MissCause.EVICTED
    # An on-time first token and a late finish after an eviction: still evicted.
    d = make_request(arrival_at_s=100.0, ttft_s=2.0, completion_s=5.0)
    late = ended(d, dispatched_s=100.5, first_s=101.0, finished_s=120.0, attempt=3)
    assert result_cause(d, late) is MissCause.EVICTED


def test_a_failed_request_is_failed_whatever_else_happened() -> None:
    r = make_request(arrival_at_s=100.0, ttft_s=2.0)
    result = ended(
        r, dispatched_s=130.0, first_s=None, finished_s=131.0, state=RequestState.FAILED, attempt=3
    )
    assert result_cause(r, result) is MissCause.FAILED


def test_a_queue_wait_mostly_spent_loading_the_model_is_model_load() -> None:
    r = make_request(arrival_at_s=100.0, ttft_s=2.0)
    result = ended(r, dispatched_s=130.0, first_s=130.5, finished_s=131.0, load_wait_s=20.0)
    assert result_cause(r, result) is MissCause.MODEL_LOAD
    # Less than half the wait loading: the rest of the queue wait dominates.
    result = ended(r, dispatched_s=130.0, first_s=130.5, finished_s=131.0, load_wait_s=10.0)
    assert result_cause(r, result) is MissCause.QUEUED


def test_an_on_time_first_token_and_a_late_finish_is_slow_decode() -> None:
    r = make_request(arrival_at_s=100.0, ttft_s=2.0, completion_s=10.0)
    result = ended(r, dispatched_s=100.1, first_s=101.0, finished_s=150.0)
    assert result_cause(r, result) is MissCause.SLOW_DECODE


def test_live_causes_leave_out_what_an_agent_cannot_know() -> None:
    assert MissCause.NO_INSTANCE not in LIVE_CAUSES
    assert MissCause.UNFINISHED not in LIVE_CAUSES
    assert MissCause.QUEUED in LIVE_CAUSES


def test_overlap_counts_only_the_part_of_each_interval_inside_the_window() -> None:
    loads = [(0.0, 5.0), (8.0, 12.0), (20.0, 30.0)]
    assert overlap_s(4.0, 10.0, loads) == pytest.approx(1.0 + 2.0)
    assert overlap_s(12.0, 20.0, loads) == 0.0
    assert overlap_s(0.0, 100.0, loads) == pytest.approx(19.0)


def test_the_recorder_counts_each_miss_under_its_cause_and_never_a_cancelled_one() -> None:
    m = PlaneMetrics(
        CollectorRegistry(),
        VirtualClock(200.0),
        slo_classes=("interactive",),
        models=("m7b",),
        instances=("i0",),
    )
    labels = {"model_name": "m7b", "slo_class": "interactive", "instance_id": "i0"}
    queued = make_request(arrival_at_s=100.0, ttft_s=2.0)
    m.request_finished(queued, ended(queued, dispatched_s=130.0, first_s=130.1, finished_s=131))
    slow = make_request(arrival_at_s=100.0, ttft_s=2.0)
    m.request_finished(slow, ended(slow, dispatched_s=100.0, first_s=115.0, finished_s=116.0))
    met = make_request(arrival_at_s=100.0, ttft_s=2.0)
    m.request_finished(met, ended(met, dispatched_s=100.0, first_s=101.0, finished_s=102.0))
    gone = make_request(arrival_at_s=100.0, ttft_s=2.0)
    cancelled = RequestState.CANCELLED
    m.request_finished(
        gone, ended(gone, dispatched_s=130, first_s=None, finished_s=140, state=cancelled)
    )

    def missed(cause: MissCause) -> float | None:
        return m.registry.get_sample_value("qlm_slo_missed_total", {**labels, "cause": cause})

    assert missed(MissCause.QUEUED) == 1
    assert missed(MissCause.IN_ENGINE) == 1
    assert missed(MissCause.EVICTED) == 0  # created at zero with the configuration
    assert missed(MissCause.FAILED) == 0  # the cancelled request is no miss
    total = sum(missed(c) or 0.0 for c in MissCause)
    evaluated = m.registry.get_sample_value("qlm_slo_evaluated_total", labels)
    met_n = m.registry.get_sample_value("qlm_slo_met_total", labels)
    assert evaluated is not None
    assert met_n is not None
    assert total == evaluated - met_n == 2
