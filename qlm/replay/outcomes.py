"""A replay's requests as the simulator's result type (`SimResult`), in scenario seconds, so that
`qlm replay` writes the very files `qlm simulate` writes and the two compare row by row.

Server-side times come from the queue's records, on the plane's clock: each is taken relative
to the request's own arrival there and multiplied by the speedup, then added to the request's
arrival in the scenario. Clock offsets between this process and the plane cancel out. Client-side
times (streamed requests) are kept beside them, in `ClientTimes`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from qlm.replay.compare import ARRIVAL_LAG, quantile
from qlm.replay.sender import Sent
from qlm.sim.result import OutcomeState, RequestOutcome, SimResult, TtftPrediction

SWAPS_FAMILY = "qlm_model_swaps"
_STATES = {  # a record's terminal state -> the simulator's outcome
    "completed": OutcomeState.COMPLETED,
    "failed": OutcomeState.FAILED,
    "cancelled": OutcomeState.FAILED,
}  # qlm_model_swaps_total, by instance and model


@dataclass(frozen=True, slots=True)
class ClientTimes:
    """One streamed request as its client saw it, in scenario seconds from its send."""

    request_id: str
    ttft_s: float | None
    estimated_wait_s: float | None


def outcome_of(sent: Sent, speedup: float) -> RequestOutcome:
    """The request's fate in scenario seconds (UNFINISHED when it never ended or was never
    admitted, FAILED when it failed or was cancelled)."""
    request, record = sent.request, sent.record
    times: Mapping[str, Any] = record.get("times") or {}
    arrival_srv = times.get("arrival_at_s")

    def at(name: str) -> float | None:
        value = times.get(name)
        if value is None or arrival_srv is None:
            return None
        return request.arrival_at_s + (float(value) - float(arrival_srv)) * speedup

    state = _STATES.get(str(record.get("state")), OutcomeState.UNFINISHED)  # unended, no record
    dispatch_s = at("dispatched_at_s")
    # The miss causes' facts, by the live plane's rule (qlm/causes/live.py): the queue wait is
    # the last dispatch less the arrival, and a request dispatched more than once was let go
    # before its last dispatch. Without them every live miss read as `in_engine`.
    queue_wait_s = 0.0 if dispatch_s is None else max(0.0, dispatch_s - request.arrival_at_s)
    interrupted = int(record.get("dispatches") or 0) > 1
    return RequestOutcome(
        request_id=request.id,
        slo_class=request.slo_class,
        model=request.model,
        instance_id=record.get("instance_id"),
        arrival_s=request.arrival_at_s,
        dispatch_s=dispatch_s,
        first_token_s=at("first_token_at_s"),
        finish_s=at("finished_at_s"),
        ttft_deadline_s=request.ttft_deadline_at_s,
        completion_deadline_s=request.completion_deadline_at_s,
        evictions=int(record.get("evictions") or 0),
        state=state,
        queue_wait_s=queue_wait_s,
        interrupted_s=dispatch_s if interrupted else None,
    )


def admission_lag_s(sent: Sent, speedup: float) -> float | None:
    """Scenario seconds from the client's send to the plane's arrival stamp (a plane on
    this host or with a synchronised clock): time the replay does not count as waiting, so a
    large lag means the API could not keep up and the comparison flatters the live plane."""
    arrival_srv = (sent.record.get("times") or {}).get("arrival_at_s")
    if arrival_srv is None or sent.sent_wall_s is None:
        return None
    return max(0.0, float(arrival_srv) - sent.sent_wall_s) * speedup


def send_lag_s(sent: Sent, speedup: float) -> float | None:
    """Scenario seconds from the request's time in the scenario to the client's send: a client
    that cannot keep the arrival times (its own process busy) sends late."""
    if sent.sent_at_s is None or sent.due_at_s is None:
        return None
    return max(0.0, sent.sent_at_s - sent.due_at_s) * speedup


def arrival_lag_s(sent: Sent, speedup: float) -> float | None:
    """Scenario seconds from the request's time in the scenario to the plane's arrival stamp:
    the send lag and the admission lag together. The plane's deadlines start at its stamp,
    so a lag moves a request later, deadline and all: the plane is then served another
    workload than the simulator's (`replay_health`)."""
    send, admission = send_lag_s(sent, speedup), admission_lag_s(sent, speedup)
    return None if send is None or admission is None else send + admission


def lag_stats(sent: Sequence[Sent], speedup: float) -> dict[str, float]:
    """p99 of the send and admission lags over all requests, and of the arrival lag per
    class (`arrival_lag_p99_s.<class>`)."""
    stats: dict[str, float] = {}
    for name, lag in (("send_lag", send_lag_s), ("admission_lag", admission_lag_s)):
        values = [v for s in sent if (v := lag(s, speedup)) is not None]
        if values:
            stats[f"{name}_p99_s"] = _p99(values)
    by_class: dict[str, list[float]] = {}
    for s in sent:
        if (v := arrival_lag_s(s, speedup)) is not None:
            by_class.setdefault(s.request.slo_class, []).append(v)
    stats.update({f"{ARRIVAL_LAG}.{c}": _p99(v) for c, v in sorted(by_class.items())})
    return stats


def _p99(values: Sequence[float]) -> float:
    return quantile(sorted(values), 0.99) or 0.0  # callers pass at least one value


def client_times(sent: Sent, speedup: float) -> ClientTimes:
    ttft_s = None
    if sent.first_chunk_at_s is not None and sent.sent_at_s is not None:
        ttft_s = (sent.first_chunk_at_s - sent.sent_at_s) * speedup
    wait_s = None if sent.estimated_wait_s is None else sent.estimated_wait_s * speedup
    return ClientTimes(sent.request.id, ttft_s, wait_s)


def swaps_by_instance(metrics_text: str) -> dict[str, int]:
    """Model swaps each instance's agent started (the plane's Prometheus counter)."""
    swaps: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != SWAPS_FAMILY:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                instance = sample.labels.get("instance_id", "")
                swaps[instance] = swaps.get(instance, 0) + int(sample.value)
    return swaps


FORECAST_BASES = ("schedule", "late")  # the dispatch decision's forecast, as the simulator's


def forecast_of(sent: Sent, speedup: float) -> TtftPrediction | None:
    """The API's wait estimate as a prediction when it is the dispatch decision's forecast
    (the function the simulator grades; a `late` one predicts a miss); None for the plan's
    fallback estimates, which the simulator makes none of."""
    wait_s = sent.estimated_wait_s
    if sent.estimate_basis not in FORECAST_BASES or wait_s is None or not math.isfinite(wait_s):
        return None
    predicted_s = None if sent.estimate_basis == "late" else wait_s * speedup
    upper = sent.estimated_wait_bound_s
    upper_s = None if upper is None or predicted_s is None else upper * speedup
    return TtftPrediction(predicted_s, sent.request.prompt_tokens, upper_s)


def live_result(
    sent: Sequence[Sent],
    speedup: float,
    seed: int,
    slo_classes: Sequence[str],
    swaps: Mapping[str, int],
    wall_s: float,
    policy: str = "qlm-live",
) -> SimResult:
    """The replay as a `SimResult` (the simulator's report writers take it as they are).
    The API's forecasts at admission are the run's `ttft_predictions` (`forecast_of`)."""
    outcomes = tuple(outcome_of(s, speedup) for s in sent)
    ends = [o.finish_s for o in outcomes if o.finish_s is not None]
    predictions = {
        s.request.id: prediction
        for s in sent
        if (prediction := forecast_of(s, speedup)) is not None
    }
    stats = lag_stats(sent, speedup)
    stats["client_errors"] = float(sum(s.error is not None for s in sent))
    return SimResult(
        policy=policy,
        seed=seed,
        slo_classes=tuple(slo_classes),
        outcomes=outcomes,
        interrupted=(),
        loads=(),
        swaps=dict(swaps),
        evictions=sum(o.evictions for o in outcomes),
        queue_samples=(),
        events_processed=0,
        start_s=min((o.arrival_s for o in outcomes), default=0.0),
        end_s=max(ends, default=0.0),
        sim_wall_s=wall_s,
        ttft_predictions=predictions,
        policy_stats=stats,
    )
