"""benchmarks/autoscale_day.py: the replay feeds the autoscaler what the control loop would see
(arrivals so far, requests queued at the tick, busy instances), so its replicas follow the
arrival rate up and down, and a busy instance holds the scale-down until it is idle."""

from __future__ import annotations

from benchmarks.autoscale_day import Sample, correlation, pools_of_fleet, replay
from qlm.config import AutoscaleConfig
from qlm.sim.result import OutcomeState, RequestOutcome
from qlm.types import Fleet, Request
from tests.factories import make_instance, make_profile, make_request

FLEET = Fleet.of([make_instance(f"a-{k}", "A100") for k in range(8)], [make_profile("m7b", "A100")])
CONFIG = AutoscaleConfig(window_s=20.0, scale_down_stabilization_s=10.0)


def served(request: Request, instance: str, finish_s: float) -> RequestOutcome:
    at = request.arrival_at_s
    return RequestOutcome(
        request_id=request.id,
        slo_class=request.slo_class,
        model=request.model,
        instance_id=instance,
        arrival_s=at,
        dispatch_s=at,
        first_token_s=at + 0.1,
        finish_s=finish_s,
        ttft_deadline_s=request.ttft_deadline_at_s,
        completion_deadline_s=None,
        evictions=0,
        state=OutcomeState.COMPLETED,
    )


def day(busy_until_s: float, busy: str = "a-4") -> list[Sample]:
    """Rate 0.5/s for 40 s, 20/s for 40 s, 0.5/s for 80 s; `busy` holds the peak's last
    request until busy_until_s."""
    requests, t = [], 0.0
    for end_s, rate in ((40.0, 0.5), (80.0, 20.0), (160.0, 0.5)):
        while t < end_s:
            requests.append(make_request(arrival_at_s=t, ttft_s=600.0))
            t += 1.0 / rate
    outcomes = [served(r, "a-0", r.arrival_at_s + 1.0) for r in requests]
    last_of_peak = max(k for k, r in enumerate(requests) if r.arrival_at_s < 80.0)
    outcomes[last_of_peak] = served(requests[last_of_peak], busy, busy_until_s)
    pools = pools_of_fleet(FLEET, {"A100": 1.0})
    return replay(requests, outcomes, FLEET, pools, CONFIG, 2.0, 200.0)


def test_replicas_follow_the_rate_up_and_down() -> None:
    samples = day(busy_until_s=0.0)
    replicas = [s.replicas["a100"] for s in samples]
    at = {round(s.at_s): s.replicas["a100"] for s in samples}
    assert at[38] <= 2 < at[60] == max(replicas)
    assert at[200] == 1  # the pool's min_replicas once the rate fell and the window passed
    rates = [s.arrivals_per_s for s in samples]
    assert correlation(rates, [float(r) for r in replicas]) > 0.5


def test_a_busy_instance_holds_the_scale_down_until_idle() -> None:
    free = day(busy_until_s=0.0)
    peak = max(s.replicas["a100"] for s in free)
    assert 2 < peak < 8
    # the peak's last ordinal works until 150 s: the pool keeps it until then
    held = day(busy_until_s=150.0, busy=f"a-{peak - 1}")
    first_drop = next(s.at_s for s in free if s.at_s > 80 and s.replicas["a100"] < peak)
    assert first_drop < 140
    kept = [s for s in held if 80 < s.at_s < 150]
    assert all(s.replicas["a100"] == peak for s in kept)
    assert any(s.draining > 0 for s in kept)
    assert next(s.replicas["a100"] for s in held if s.at_s >= 150) < peak
