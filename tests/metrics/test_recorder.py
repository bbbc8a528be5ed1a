"""PlaneMetrics: each hook moves exactly the series it documents, on its own registry."""

from __future__ import annotations

from dataclasses import replace

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry

from qlm.clock import VirtualClock
from qlm.control.plan import PlanForecast, PlannedGroup, PublishedPlan
from qlm.metrics import NO_METRICS, MetricsConfig, PlaneMetrics, met_slo
from qlm.queue.records import InstanceStatus, RequestResult
from qlm.solver.plan_types import Plan, PlanStatus
from qlm.types import Request, RequestState
from tests.factories import make_request

CLASSES = ("interactive", "batch")
MODELS = ("m7b", "m13b")


def recorder(**settings: object) -> PlaneMetrics:
    return PlaneMetrics(
        CollectorRegistry(),
        VirtualClock(100.0),
        slo_classes=CLASSES,
        models=MODELS,
        instances=("i0",),
        planner_policy="milp",
        settings=MetricsConfig.model_validate(settings),
    )


def value(m: PlaneMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def result(
    request: Request,
    *,
    first_s: float | None,
    finished_s: float | None,
    state: RequestState = RequestState.COMPLETED,
) -> RequestResult:
    return RequestResult(
        request.id,
        state,
        "i0",
        output_tokens=3,
        first_token_at_s=first_s,
        finished_at_s=finished_s,
    )


def test_met_slo_needs_first_token_by_ttft_and_finish_by_completion_deadline() -> None:
    r = make_request(arrival_at_s=0.0, ttft_s=2.0, completion_s=10.0)
    assert met_slo(r, result(r, first_s=2.0, finished_s=10.0))
    assert not met_slo(r, result(r, first_s=2.1, finished_s=5.0))
    assert not met_slo(r, result(r, first_s=1.0, finished_s=10.5))
    assert not met_slo(r, result(r, first_s=1.0, finished_s=2.0, state=RequestState.FAILED))
    no_deadline = make_request(ttft_s=2.0)
    assert met_slo(no_deadline, result(no_deadline, first_s=1.0, finished_s=1e9))


def test_every_configured_series_exists_at_zero_before_any_event() -> None:
    m = recorder(attainment_targets={"interactive": 0.95}, default_attainment_target=0.9)
    labels = {"model_name": "m13b", "slo_class": "batch"}
    assert value(m, "qlm_requests_total", **labels, outcome="rejected") == 0.0
    assert value(m, "qlm_slo_evaluated_total", **labels, instance_id="i0") == 0.0
    assert value(m, "qlm_queue_depth", **labels) == 0.0
    assert value(m, "qlm_planner_runs_total", policy="milp", status="failed") == 0.0
    assert value(m, "qlm_slo_attainment_target", slo_class="interactive") == 0.95
    assert value(m, "qlm_slo_attainment_target", slo_class="batch") == 0.9


def test_finished_requests_feed_attainment_pair_outcomes_and_latencies() -> None:
    m = recorder()
    on_time = make_request(model="m7b", arrival_at_s=10.0, ttft_s=2.0)
    late = make_request(model="m7b", arrival_at_s=10.0, ttft_s=2.0)
    m.request_admitted(on_time)
    m.request_admitted(late)
    m.request_finished(on_time, result(on_time, first_s=11.0, finished_s=14.0))
    m.request_finished(late, result(late, first_s=13.0, finished_s=20.0))
    labels = {"model_name": "m7b", "slo_class": "interactive"}
    assert value(m, "qlm_requests_total", **labels, outcome="admitted") == 2
    assert value(m, "qlm_requests_total", **labels, outcome="completed") == 2
    assert value(m, "qlm_slo_met_total", **labels, instance_id="i0") == 1
    assert value(m, "qlm_slo_evaluated_total", **labels, instance_id="i0") == 2
    assert value(m, "qlm_request_ttft_seconds_sum", **labels) == pytest.approx(1.0 + 3.0)
    assert value(m, "qlm_request_e2e_seconds_sum", **labels) == pytest.approx(4.0 + 10.0)
    assert value(m, "qlm_request_ttft_seconds_bucket", **labels, le="1.0") == 1
    assert value(m, "qlm_request_ttft_seconds_bucket", **labels, le="5.0") == 2


def test_cancelled_requests_count_as_outcome_but_not_against_attainment() -> None:
    m = recorder()
    r = make_request(model="m13b", slo_class="batch")
    m.request_cancelled(r)
    m.request_finished(r, result(r, first_s=None, finished_s=1.0, state=RequestState.CANCELLED))
    labels = {"model_name": "m13b", "slo_class": "batch"}
    assert value(m, "qlm_requests_total", **labels, outcome="cancelled") == 2
    assert value(m, "qlm_slo_evaluated_total", **labels, instance_id="i0") == 0


def test_failed_requests_count_as_misses() -> None:
    m = recorder()
    r = make_request(model="m7b", slo_class="batch")
    m.request_finished(r, result(r, first_s=None, finished_s=1.0, state=RequestState.FAILED))
    labels = {"model_name": "m7b", "slo_class": "batch"}
    assert value(m, "qlm_requests_total", **labels, outcome="failed") == 1
    assert value(m, "qlm_slo_evaluated_total", **labels, instance_id="i0") == 1
    assert value(m, "qlm_slo_met_total", **labels, instance_id="i0") == 0


def test_unknown_models_and_classes_are_clamped_to_other() -> None:
    m = recorder()
    for i in range(5):
        m.request_rejected(f"made-up-{i}", f"class-{i}", "model_not_found")
    m.request_rejected("m7b", None, "queue_full")
    other = {"model_name": "other", "slo_class": "other", "outcome": "rejected"}
    assert value(m, "qlm_requests_total", **other) == 5
    assert value(m, "qlm_request_rejections_total", reason="model_not_found") == 5
    assert value(m, "qlm_request_rejections_total", reason="queue_full") == 1
    names = {s.labels.get("model_name") for s in _samples(m, "qlm_requests_total")}
    assert names == {"m7b", "m13b", "other"}


def _samples(m: PlaneMetrics, name: str) -> list[prometheus_client.samples.Sample]:
    return [s for fam in m.registry.collect() for s in fam.samples if s.name == name]


def plan_with(
    groups: dict[str, tuple[str, tuple[str, ...]]], waits: dict[str, float]
) -> PublishedPlan:
    return PublishedPlan(
        epoch=1,
        created_at_s=0.0,
        queues={"i0": tuple(groups)},
        groups={gid: PlannedGroup(gid, "m7b", cls, ids) for gid, (cls, ids) in groups.items()},
        forecast=PlanForecast(predicted_wait_s=waits),
    )


def advance(m: PlaneMetrics, seconds: float) -> None:
    assert isinstance(m.clock, VirtualClock)
    m.clock.advance_by(seconds)


def test_queue_snapshot_counts_depth_and_groups_that_still_hold_queued_requests() -> None:
    m = recorder()
    a = make_request(id="a", model="m7b", slo_class="interactive")
    b = make_request(id="b", model="m7b", slo_class="interactive")
    c = make_request(id="c", model="m13b", slo_class="batch")
    plan = plan_with({"g1": ("interactive", ("a", "b")), "g2": ("batch", ("gone",))}, {})
    m.queue_snapshot([a, b, c], plan)
    assert value(m, "qlm_queue_depth", model_name="m7b", slo_class="interactive") == 2
    assert value(m, "qlm_queue_depth", model_name="m13b", slo_class="batch") == 1
    assert value(m, "qlm_request_groups", slo_class="interactive") == 1
    assert value(m, "qlm_request_groups", slo_class="batch") == 0  # its member left
    m.queue_snapshot([c], plan)  # within sample_every_s of the last: not recorded
    assert value(m, "qlm_queue_depth", model_name="m7b", slo_class="interactive") == 2
    advance(m, 1.0)
    m.queue_snapshot([c], plan)
    assert value(m, "qlm_queue_depth", model_name="m7b", slo_class="interactive") == 0
    assert value(m, "qlm_request_groups", slo_class="interactive") == 0


def test_losing_the_lease_zeroes_the_queue_gauges() -> None:
    m = recorder()
    m.leadership(True)
    m.queue_snapshot([make_request(model="m7b", slo_class="batch")], None)
    assert value(m, "qlm_controller_leading") == 1
    m.leadership(False)
    assert value(m, "qlm_controller_leading") == 0
    assert value(m, "qlm_queue_depth", model_name="m7b", slo_class="batch") == 0


def solved(status: PlanStatus, wall_s: float) -> Plan:
    return Plan(queues={}, status=status, policy="milp", objective=0.0, solve_wall_s=wall_s,
                predictions={})  # fmt: skip


def test_planned_records_status_solve_time_and_pairs_predictions_with_actual_waits() -> None:
    m = recorder()
    r = make_request(id="r", model="m7b", arrival_at_s=40.0, ttft_s=30.0)
    plan = plan_with({"g": ("interactive", ("r",))}, {"r": 5.0})
    m.planned(solved(PlanStatus.OPTIMAL, 0.2), plan, [r], now_s=50.0)
    m.planned(solved(PlanStatus.FALLBACK, 0.9), plan, [r], now_s=52.0)  # r already predicted
    m.plan_failed()
    assert value(m, "qlm_planner_runs_total", policy="milp", status="optimal") == 1
    assert value(m, "qlm_planner_runs_total", policy="milp", status="fallback") == 1
    assert value(m, "qlm_planner_runs_total", policy="milp", status="failed") == 1
    assert value(m, "qlm_planner_solve_seconds_sum", policy="milp") == pytest.approx(1.1)
    labels = {"model_name": "m7b", "slo_class": "interactive"}
    assert value(m, "qlm_wait_predicted_seconds_count", **labels) == 1
    assert value(m, "qlm_wait_predicted_seconds_sum", **labels) == pytest.approx(15.0)
    m.request_finished(r, result(r, first_s=57.0, finished_s=60.0))  # 2 s after predicted 55
    assert value(m, "qlm_wait_prediction_error_seconds_sum", slo_class="interactive") == 2.0
    assert value(m, "qlm_wait_prediction_abs_error_seconds_bucket", slo_class="interactive",
                 le="1.0") == 0  # fmt: skip
    assert value(m, "qlm_wait_prediction_abs_error_seconds_bucket", slo_class="interactive",
                 le="2.0") == 1  # fmt: skip
    early = make_request(id="e", model="m7b", arrival_at_s=40.0, ttft_s=30.0)
    m.planned(solved(PlanStatus.OPTIMAL, 0.1), plan_with({}, {"e": 20.0}), [early], now_s=50.0)
    m.request_finished(early, result(early, first_s=60.0, finished_s=61.0))  # 10 s early
    assert value(m, "qlm_wait_prediction_error_seconds_sum", slo_class="interactive") == -8.0
    assert value(m, "qlm_wait_prediction_error_seconds_count", slo_class="interactive") == 2


def test_admission_estimates_pair_with_the_actual_wait_of_the_same_requests() -> None:
    """Observed when a request completes, so predicted and actual cover the same requests;
    requests that did not come through the API (no estimate) are left out of the pairing."""
    m = recorder()
    labels = {"model_name": "m7b", "slo_class": "interactive"}
    for rid, estimate_s, first_s in (("a", 4.0, 46.0), ("b", 1.0, 41.5)):
        r = replace(
            make_request(id=rid, model="m7b", arrival_at_s=40.0), estimated_wait_s=estimate_s
        )
        m.request_finished(r, result(r, first_s=first_s, finished_s=first_s + 1.0))
    plain = make_request(id="c", model="m7b", arrival_at_s=40.0)
    m.request_finished(plain, result(plain, first_s=42.0, finished_s=43.0))
    assert value(m, "qlm_request_ttft_seconds_count", **labels) == 3
    assert value(m, "qlm_wait_estimated_seconds_count", **labels) == 2
    assert value(m, "qlm_wait_estimated_seconds_sum", **labels) == 5.0
    assert (
        value(m, "qlm_wait_estimate_error_seconds_sum", slo_class="interactive") == 2.5
    )  # 2 + 0.5
    assert value(m, "qlm_wait_estimate_error_seconds_count", slo_class="interactive") == 2


def test_evictions_and_swaps_count_per_instance_and_appear_as_recent_events() -> None:
    m = recorder(recent_events=3)
    requests = [make_request(slo_class="batch") for _ in range(3)]
    m.evicted("i0", requests)
    m.evicted("i0", requests[:1], kind="kv_swap")
    m.model_loaded("i0", "m7b", 30.0)  # the initial load: no swap started
    m.model_swap_started("i0", "m13b", "m7b")
    m.model_loaded("i0", "m13b", 12.0)
    assert value(m, "qlm_evictions_total", instance_id="i0", slo_class="batch", kind="abort") == 3
    assert value(m, "qlm_evictions_total", instance_id="i0", slo_class="batch",
                 kind="kv_swap") == 1  # fmt: skip
    assert value(m, "qlm_model_swaps_total", instance_id="i0", model_name="m13b") == 1
    assert value(m, "qlm_model_swap_seconds_count", model_name="m13b") == 1
    assert value(m, "qlm_model_swap_seconds_sum", model_name="m13b") == 12.0
    assert value(m, "qlm_model_swap_seconds_count", model_name="m7b") is None  # not a swap
    assert [e.kind for e in m.events] == ["eviction", "swap", "swapped"]  # the last 3
    swap, swapped = list(m.events)[1:]
    assert swap.detail == "m7b -> m13b"
    assert swapped.detail == "m7b -> m13b: serving after 12.0 s of loading"  # its cost
    with pytest.raises(ValueError, match="eviction kind"):
        m.evicted("i0", requests, kind="boom")


def status(model: str | None, state: str, running: int = 0) -> InstanceStatus:
    return InstanceStatus("i0", state, model, busy_s=3.0, running=running, kv_used_tokens=25,
                          kv_capacity_tokens=100, at_s=0.0)  # fmt: skip


def test_instance_state_is_one_hot_and_drops_the_previous_models_series() -> None:
    m = recorder()
    m.instance_status(status("m7b", "ready", running=4))
    assert value(m, "qlm_instance_state", instance_id="i0", state="ready", model_name="m7b") == 1
    assert value(m, "qlm_instance_state", instance_id="i0", state="loading",
                 model_name="m7b") == 0  # fmt: skip
    assert value(m, "qlm_instance_running_requests", instance_id="i0") == 4
    assert value(m, "qlm_instance_kv_utilization_ratio", instance_id="i0") == 0.25
    m.instance_status(status("m13b", "loading"))
    assert value(m, "qlm_instance_state", instance_id="i0", state="ready", model_name="m7b") is None
    assert value(m, "qlm_instance_state", instance_id="i0", state="loading",
                 model_name="m13b") == 1  # fmt: skip
    m.instance_status(status(None, "empty"))
    assert value(m, "qlm_instance_state", instance_id="i0", state="empty", model_name="none") == 1


def test_engine_prefix_tallies_become_counters_that_survive_an_engine_restart() -> None:
    m = recorder()
    m.instance_status(status("m7b", "ready"))  # an engine that does not report them
    assert value(m, "qlm_prefix_prompt_tokens_total", instance_id="i0") is None
    for prompt, hit in ((1000, 400), (1500, 900), (300, 100)):  # the last: after a restart
        m.instance_status(
            replace(status("m7b", "ready"), prefix_prompt_tokens=prompt, prefix_hit_tokens=hit)
        )
    assert value(m, "qlm_prefix_prompt_tokens_total", instance_id="i0") == 1500 + 300
    assert value(m, "qlm_prefix_hit_tokens_total", instance_id="i0") == 900 + 100


def test_two_recorders_share_nothing_and_leave_the_global_registry_alone() -> None:
    before = {s.name for fam in prometheus_client.REGISTRY.collect() for s in fam.samples}
    a, b = recorder(), recorder()
    a.request_admitted(make_request(model="m7b"))
    labels = {"model_name": "m7b", "slo_class": "interactive", "outcome": "admitted"}
    assert value(a, "qlm_requests_total", **labels) == 1
    assert value(b, "qlm_requests_total", **labels) == 0
    after = {s.name for fam in prometheus_client.REGISTRY.collect() for s in fam.samples}
    assert not {n for n in after - before if n.startswith("qlm_")}


def test_no_metrics_offers_every_hook_of_the_recorder() -> None:
    hooks = {n for n in dir(NO_METRICS) if not n.startswith("_")}
    public = {
        n for n in dir(PlaneMetrics) if not n.startswith("_") and callable(getattr(PlaneMetrics, n))
    }
    assert hooks == public - {"for_plane"}
