"""The live plane's miss causes: what the agent that ended a request knew of it, as facts for
the shared classifier (qlm/causes/classify.py). Pure: the agent measures, these functions only
combine.

From the request and its result (qlm/queue/records.py `RequestResult`):

* queue wait: its last dispatch minus its arrival (`dispatched_at_s - arrival_at_s`);
* in engine: its first token minus its last dispatch (the rest of its time to first token);
* evicted: an earlier attempt ended without a result (`attempt > 1`: evicted, aborted by the
  engine, lost with a failed engine or an expired lease), so it was let go before its last
  dispatch, hence before the first token of the attempt that ended it;
* model_load: `load_wait_s`, the part of its queue wait during which the instance that served
  it was loading that model (the agent knows when its loads started and ended);
* no_instance: never. Whether no instance of the fleet had the model loaded or loading is not
  something one agent knows, so that share is 0 and such waits count as `queued`.

A live request has ended when it is classified, so it is never `unfinished`.
"""

from __future__ import annotations

from collections.abc import Iterable

from qlm.causes.classify import MissCause, MissFacts, classify_miss
from qlm.queue.records import RequestResult
from qlm.types import Request, RequestState

# The causes a live request can get (no_instance: unknown to an agent; unfinished: it ended).
LIVE_CAUSES = tuple(c for c in MissCause if c not in (MissCause.NO_INSTANCE, MissCause.UNFINISHED))


def result_facts(request: Request, result: RequestResult) -> MissFacts:
    """The classifier's facts of an ended (completed or failed) live request."""
    arrival_s = request.arrival_at_s
    dispatched_s = arrival_s if result.dispatched_at_s is None else result.dispatched_at_s
    return MissFacts(
        arrival_s=arrival_s,
        ttft_deadline_s=request.ttft_deadline_at_s,
        completion_deadline_s=request.completion_deadline_at_s,
        first_token_s=result.first_token_at_s,
        finished_s=result.finished_at_s,
        failed=result.state is not RequestState.COMPLETED,
        interrupted_s=dispatched_s if result.attempt > 1 else None,
        queue_wait_s=max(0.0, dispatched_s - arrival_s),
        load_wait_s=result.load_wait_s,
    )


def result_cause(request: Request, result: RequestResult) -> MissCause | None:
    """Why an ended live request missed its SLO; None when it met it. Shares end at its first
    token, or at its end without one."""
    facts = result_facts(request, result)
    end_s = facts.finished_s
    if end_s is None:
        end_s = facts.arrival_s + facts.queue_wait_s
    return classify_miss(facts, end_s)


def overlap_s(start_s: float, end_s: float, intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds of [start_s, end_s] covered by the (start, end) intervals, assumed disjoint (one
    instance loads one model at a time)."""
    total = 0.0
    for lo, hi in intervals:
        total += max(0.0, min(end_s, hi) - max(start_s, lo))
    return total
