"""The dashboard's view over a process's own registry: the same figures the exposition shows."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from qlm.clock import VirtualClock
from qlm.metrics import Dashboard, LocalSource, PlaneMetrics, render
from qlm.queue.records import InstanceStatus, RequestResult
from qlm.types import Request, RequestState
from tests.factories import make_request

CLASSES = ("interactive", "batch")


def recorder(clock: VirtualClock) -> PlaneMetrics:
    return PlaneMetrics(
        CollectorRegistry(), clock, slo_classes=CLASSES, models=("m7b",), planner_policy="edf"
    )


def finish(m: PlaneMetrics, request: Request, first_s: float, instance_id: str = "i0") -> None:
    result = RequestResult(
        request.id,
        RequestState.COMPLETED,
        instance_id,
        first_token_at_s=first_s,
        finished_at_s=first_s + 1.0,
    )
    m.request_finished(request, result)


def exposed_sum(m: PlaneMetrics, sample_name: str, slo_class: str) -> float:
    """What a scraper sees: the sum over every series of a sample name for one class."""
    text = render(m.registry, None)[0].decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample_name and s.labels.get("slo_class") == slo_class
    )


async def test_view_reports_what_the_exposition_reports() -> None:
    clock = VirtualClock(1000.0)
    m = recorder(clock)
    for i in range(5):  # 3 of 5 interactive requests on time, over two instances
        r = make_request(model="m7b", arrival_at_s=990.0, ttft_s=5.0)
        finish(m, r, 993.0 if i < 3 else 999.0, instance_id=f"i{i % 2}")
    finish(m, make_request(model="m7b", slo_class="batch", ttft_s=60.0), 10.0)
    m.queue_snapshot([make_request(model="m7b", slo_class="batch") for _ in range(4)], None)
    m.instance_status(InstanceStatus("i0", "ready", "m7b", 2.0, 3, 10, 100, 1000.0, 0, 0))
    # engines' prefix tallies are cumulative: the second report adds 3,000 prompt, 2,000 hit
    tallies = InstanceStatus("i0", "ready", "m7b", 2.0, 3, 10, 100, 1000.0, 0, 0, 1000, 0)
    m.instance_status(tallies)
    m.instance_status(replace(tallies, prefix_prompt_tokens=4000, prefix_hit_tokens=2000))
    m.model_swap_started("i1", "m7b")
    view = await Dashboard(LocalSource(m), clock, CLASSES).view()

    assert view["classes"] == ["interactive", "batch"]
    interactive = view["attainment"]["interactive"]
    assert interactive["met"] == exposed_sum(m, "qlm_slo_met_total", "interactive") == 3
    assert interactive["evaluated"] == exposed_sum(m, "qlm_slo_evaluated_total", "interactive")
    assert interactive["ratio"] == 3 / 5
    assert interactive["target"] == 0.99
    assert view["attainment"]["batch"]["ratio"] == 1.0
    assert view["queue"] == {"interactive": 0, "batch": 4}
    # The 2 late ones: no dispatch time in their results, so all their wait was in an engine.
    assert view["misses_by_cause"] == {"interactive": {"in_engine": 2}, "batch": {}}
    assert view["waits"]["interactive"]["actual_mean_s"] == (3 * 3.0 + 2 * 9.0) / 5
    assert view["waits"]["interactive"]["predicted_mean_s"] is None  # none came via the API
    assert view["waits"]["interactive"]["actual_n"] == 5
    [i0] = [i for i in view["instances"] if i["instance_id"] == "i0"]
    assert (i0["state"], i0["model_name"], i0["running"]) == ("ready", "m7b", 3)
    assert i0["prefix_reuse"] == 2000 / 4000
    assert view["prefix"] == {"prompt_tokens": 4000, "hit_tokens": 2000, "reuse": 0.5}
    [i1] = [i for i in view["instances"] if i["instance_id"] == "i1"]
    assert i1["prefix_reuse"] is None  # reported nothing
    assert [(e["kind"], e["instance_id"]) for e in view["events"]] == [("swap", "i1")]
    assert view["source"] == "local"


async def test_history_grows_once_per_interval_and_views_are_cached_for_it() -> None:
    clock = VirtualClock(0.0)
    m = recorder(clock)
    dashboard = Dashboard(LocalSource(m), clock, CLASSES, refresh_s=1.0)
    first = await dashboard.view()
    finish(m, make_request(model="m7b", arrival_at_s=0.0, ttft_s=5.0), 1.0)
    clock.advance_by(0.5)
    assert await dashboard.view() is first  # cached: one read per interval
    clock.advance_by(0.5)
    second = await dashboard.view()
    assert [p["t"] for p in second["history"]] == [0.0, 1.0]
    assert [p["met"].get("interactive", 0) for p in second["history"]] == [0, 1]
    assert second["attainment"]["interactive"]["met"] == 1
