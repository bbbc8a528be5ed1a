"""Every metric QLM exports, created on an injected CollectorRegistry (never the module-global
one, so two planes in one process, or two tests, never share counters).

Names start with `qlm_`; labels follow llm-d's vocabulary (`model_name`, `slo_class`). The
engine instance is `instance_id`, not `instance`: Prometheus sets `instance` on every scraped
series to the target's address and would rename ours to `exported_instance`.
qlm/metrics/README.md lists each metric with its labels and where it is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary

from qlm.queue.records import InstanceStatus

# Interactive classes live in seconds, batch classes in minutes to hours: one ladder covers both.
LATENCY_BUCKETS_S = (
    *(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0),
    *(120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0),
)
SOLVE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
SWAP_BUCKETS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)

REQUEST_OUTCOMES = ("admitted", "rejected", "completed", "cancelled", "failed")
PLAN_FAILED = "failed"  # planner status label for a re-plan that raised
EVICTION_KINDS = ("abort", "kv_swap")  # abort and requeue / KV moved to CPU memory
_MODEL_CLASS_LABELS = ("model_name", "slo_class")  # the labels most request families share


@dataclass(frozen=True)
class Families:
    """Every metric family, one field each, registered on one registry (`on`)."""

    requests: Counter
    rejections: Counter
    slo_met: Counter
    slo_evaluated: Counter
    slo_missed: Counter
    attainment_target: Gauge
    ttft: Histogram
    e2e: Histogram
    queue_depth: Gauge
    groups: Gauge
    wait_predicted: Histogram
    wait_estimated: Histogram
    wait_estimate_error: Summary
    wait_error: Summary
    wait_abs_error: Histogram
    solve: Histogram
    planner_runs: Counter
    leading: Gauge
    evictions: Counter
    swaps: Counter
    swap_time: Histogram
    instance_state: Gauge
    instance_running: Gauge
    instance_kv: Gauge
    instance_busy: Gauge
    prefix_prompt: Counter
    prefix_hit: Counter

    @classmethod
    def on(cls, registry: CollectorRegistry) -> Families:
        """Create and register every family on `registry`, in the order they are exposed."""
        return cls(
            **_request_families(registry),
            **_slo_families(registry),
            **_queue_families(registry),
            **_planner_families(registry),
            **_agent_families(registry),
            **_instance_families(registry),
        )


def _request_families(r: CollectorRegistry) -> dict[str, Any]:
    """Requests by outcome at the API and at their end, and refusals by reason."""
    return {
        "requests": Counter(
            "qlm_requests_total",
            "Requests by outcome: admitted and rejected at the API; completed, cancelled "
            "and failed when the request ends.",
            (*_MODEL_CLASS_LABELS, "outcome"),
            registry=r,
        ),
        "rejections": Counter(
            "qlm_request_rejections_total",
            "Requests the API refused, by error code (queue_full, model_not_found, ...).",
            ("reason",),
            registry=r,
        ),
    }


def _slo_families(r: CollectorRegistry) -> dict[str, Any]:
    """SLO attainment (numerator, denominator, target) and the latencies it judges."""
    return {
        "slo_met": Counter(
            "qlm_slo_met_total",
            "Ended requests that met every SLO target they carried (numerator of attainment).",
            (*_MODEL_CLASS_LABELS, "instance_id"),
            registry=r,
        ),
        "slo_evaluated": Counter(
            "qlm_slo_evaluated_total",
            "Ended requests judged against their SLO: completed and failed, not cancelled "
            "(denominator of attainment).",
            (*_MODEL_CLASS_LABELS, "instance_id"),
            registry=r,
        ),
        "slo_missed": Counter(
            "qlm_slo_missed_total",
            "Ended requests that missed their SLO, by why (qlm/causes: failed, evicted, "
            "model_load, queued, in_engine, slow_decode, as the agent that ended it saw).",
            (*_MODEL_CLASS_LABELS, "instance_id", "cause"),
            registry=r,
        ),
        "attainment_target": Gauge(
            "qlm_slo_attainment_target",
            "Configured attainment target per class (metrics.attainment_targets).",
            ("slo_class",),
            registry=r,
        ),
        "ttft": Histogram(
            "qlm_request_ttft_seconds",
            "Arrival to first token of completed requests (the actual wait).",
            _MODEL_CLASS_LABELS,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        ),
        "e2e": Histogram(
            "qlm_request_e2e_seconds",
            "Arrival to last token of completed requests.",
            _MODEL_CLASS_LABELS,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        ),
    }


def _queue_families(r: CollectorRegistry) -> dict[str, Any]:
    """The queue as the control loop sees it, and how well it predicts waits."""
    return {
        "queue_depth": Gauge(
            "qlm_queue_depth",
            "Queued requests (not yet in an engine), as the leading control loop last saw.",
            _MODEL_CLASS_LABELS,
            registry=r,
        ),
        "groups": Gauge(
            "qlm_request_groups",
            "Request groups in the current plan that still hold queued requests.",
            ("slo_class",),
            registry=r,
        ),
        "wait_predicted": Histogram(
            "qlm_wait_predicted_seconds",
            "Predicted arrival to first token, once per request at the first full plan "
            "that places it.",
            _MODEL_CLASS_LABELS,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        ),
        "wait_estimated": Histogram(
            "qlm_wait_estimated_seconds",
            "The wait the API predicted at admission (arrival to first token), observed "
            "when the request completes: the same requests as qlm_request_ttft_seconds.",
            _MODEL_CLASS_LABELS,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        ),
        "wait_estimate_error": Summary(
            "qlm_wait_estimate_error_seconds",
            "Actual time to first token minus the wait predicted at admission (negative: "
            "sooner than predicted), per completed request; sum/count is the bias.",
            ("slo_class",),
            registry=r,
        ),
        "wait_error": Summary(
            "qlm_wait_prediction_error_seconds",
            "Actual minus predicted first-token time (negative: earlier than predicted), "
            "for requests planned and completed in the same process; sum/count is the bias.",
            ("slo_class",),
            registry=r,
        ),
        "wait_abs_error": Histogram(
            "qlm_wait_prediction_abs_error_seconds",
            "|actual - predicted| first-token time, same requests as the error summary "
            "(a histogram with negative buckets could not carry a sum).",
            ("slo_class",),
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        ),
    }


def _planner_families(r: CollectorRegistry) -> dict[str, Any]:
    """Re-plans: solve time, status, and leadership of the control loop."""
    return {
        "solve": Histogram(
            "qlm_planner_solve_seconds",
            "Wall time of each full re-plan's solve.",
            ("policy",),
            buckets=SOLVE_BUCKETS_S,
            registry=r,
        ),
        "planner_runs": Counter(
            "qlm_planner_runs_total",
            "Full re-plans by planner status (optimal, feasible, timeout, local, fallback, "
            "heuristic) or failed (the solve raised; the last plan stays).",
            ("policy", "status"),
            registry=r,
        ),
        "leading": Gauge(
            "qlm_controller_leading",
            "1 while this control loop holds the leader lease.",
            registry=r,
        ),
    }


def _agent_families(r: CollectorRegistry) -> dict[str, Any]:
    """What agents do to engines: evictions and model swaps."""
    return {
        "evictions": Counter(
            "qlm_evictions_total",
            "Requests evicted from an engine: aborted and requeued, or KV moved to CPU.",
            ("instance_id", "slo_class", "kind"),
            registry=r,
        ),
        "swaps": Counter(
            "qlm_model_swaps_total",
            "Model swaps an agent started, by the model swapped in.",
            ("instance_id", "model_name"),
            registry=r,
        ),
        "swap_time": Histogram(
            "qlm_model_swap_seconds",
            "From a swap's start until the new model serves.",
            ("model_name",),
            buckets=SWAP_BUCKETS_S,
            registry=r,
        ),
    }


def _instance_families(r: CollectorRegistry) -> dict[str, Any]:
    """Each engine instance's state, load and backlog."""
    return {
        "instance_state": Gauge(
            "qlm_instance_state",
            "1 for the engine's current state (empty, loading, ready, failed), else 0; "
            "model_name is the loaded (or loading) model, 'none' without one.",
            ("instance_id", "state", "model_name"),
            registry=r,
        ),
        "instance_running": Gauge(
            "qlm_instance_running_requests",
            "Requests inside the engine.",
            ("instance_id",),
            registry=r,
        ),
        "instance_kv": Gauge(
            "qlm_instance_kv_utilization_ratio",
            "KV cache tokens used over capacity.",
            ("instance_id",),
            registry=r,
        ),
        "instance_busy": Gauge(
            "qlm_instance_busy_seconds",
            "Estimated seconds until the work in the engine drains.",
            ("instance_id",),
            registry=r,
        ),
        "prefix_prompt": Counter(
            "qlm_prefix_prompt_tokens",
            "Prompt tokens the engine admitted with a prefix (engines that report it).",
            ("instance_id",),
            registry=r,
        ),
        "prefix_hit": Counter(
            "qlm_prefix_hit_tokens",
            "Of those, tokens found in the engine's prefix cache: not computed again.",
            ("instance_id",),
            registry=r,
        ),
    }


class PrefixTallies:
    """Engines' running prefix-cache tallies (InstanceStatus) as Prometheus counters: each
    report adds what grew since the instance's last one (all of it after an engine restart,
    when its tally starts again); engines that do not report them add nothing."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, int]] = {}  # instance -> (prompt, hit) last reported

    def report(self, families: Families, status: InstanceStatus) -> None:
        prompt, hit = status.prefix_prompt_tokens, status.prefix_hit_tokens
        if prompt is None or hit is None:
            return
        iid = status.instance_id
        last_prompt, last_hit = self._seen.get(iid, (0, 0))
        if prompt < last_prompt or hit < last_hit:
            last_prompt = last_hit = 0
        families.prefix_prompt.labels(iid).inc(prompt - last_prompt)
        families.prefix_hit.labels(iid).inc(hit - last_hit)
        self._seen[iid] = (prompt, hit)
