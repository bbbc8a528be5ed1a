"""The RWT estimator on small hand-computed cases (the Monte Carlo check is separate).

The standard case: one A100 (80 GiB) with m7b loaded; a one-row decode table of 0.02 s per
step, max_batch_size B = 4, 10k prefill tokens/s, outputs mean 200 / std 100, load 10 s.
Groups have 500-token prompts and a high output cap, so:
  prefill p = 500 / 10k = 0.05 s, Theta = B / step = 4 / 0.02 = 200 tokens/s,
  decode work per request d = 200 / 200 = 1.0 s, variance (100 / 200)^2 = 0.25 s^2,
  own decode 200 x 0.02 = 4.0 s (std 100 x 0.02 = 2.0 s),
  idle-start alignment = (200^2 - 100^2) / (2 x 200) x 0.02 = 1.5 s.
"""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist

import numpy as np
import pytest

from qlm.config import EstimatorConfig
from qlm.estimator import RwtEstimator
from qlm.grouping.group import RequestGroup
from qlm.types import Fleet, Instance
from tests.factories import make_group, make_instance, make_profile

P = 0.05  # prefill of one 500-token prompt
D = 1.0  # decode work of one request out of the shared throughput
V = 0.25  # its variance
OWN = 4.0  # a request's own decode time
OWN_STD = 2.0
ALIGN = 1.5  # idle-start alignment offset
B = 4
LOAD = 10.0
Z95 = NormalDist().inv_cdf(0.95)  # 1.6449
BIG_CAP = 10_000.0  # output cap far above the profile mean


def _estimator(
    *,
    output_std: float = 100.0,
    load_s: float = LOAD,
    percentile: float = 0.95,
    models: tuple[str, ...] = ("m7b",),
    instances: tuple[Instance, ...] = (),
) -> tuple[RwtEstimator, Instance]:
    instance = make_instance()
    profiles = [
        make_profile(
            model,
            step_s=(0.02,),
            batch_sizes=(1,),
            max_batch_size=B,
            output_mean=200.0,
            output_std=output_std,
            load_s=load_s,
        )
        for model in models
    ]
    fleet = Fleet.of([instance, *instances], profiles)
    return RwtEstimator(EstimatorConfig(percentile=percentile), fleet), instance


def _group(id: str = "g", size: int = 8, model: str = "m7b", **kwargs: object) -> RequestGroup:
    return make_group(id, size=size, model=model, output_cap=BIG_CAP, **kwargs)  # type: ignore[arg-type]


# --- rates --------------------------------------------------------------------------------


def test_rates_none_when_instance_cannot_serve() -> None:
    a10 = make_instance("a10", "A10", memory_gib=24.0)
    h100 = make_instance("h100", "H100")
    big = make_profile("m13b", "A10", weight_gib=26.0)  # 26 GiB > 0.9 x 24 GiB
    fleet = Fleet.of([a10, h100], [big, make_profile("m13b", "A100")])
    estimator = RwtEstimator(EstimatorConfig(), fleet)
    group = make_group(model="m13b")
    # Weights do not fit the A10; there is no H100 profile at all.
    for instance in (a10, h100):
        assert estimator.rates(group, instance) is None
        assert estimator.group_cost(group, instance) is None
        with pytest.raises(ValueError, match="cannot serve model m13b"):
            estimator.estimate_queue([group], instance)


def test_an_engine_sharing_its_gpu_is_priced_as_if_alone_on_it() -> None:
    whole = make_instance("whole", memory_gib=40.0)
    half = replace(make_instance("half", memory_gib=40.0), slices=2, device="gpu0")
    fleet = Fleet.of([whole, half], [make_profile("m7b")])
    estimator = RwtEstimator(EstimatorConfig(), fleet)
    group = make_group(model="m7b")
    assert estimator.rates(group, half) == estimator.rates(group, whole)


@pytest.mark.parametrize(
    ("output_cap", "mu", "sigma", "batch"),
    [
        # cap above the profile mean: mu = 200, sigma = 150; context 700 -> 475136 // 700
        (512.0, 200.0, 150.0, 678),
        # cap equal to the mean: unchanged
        (200.0, 200.0, 150.0, 678),
        # cap below: mu = 100, sigma scaled by 100/200 -> 75; context 600 -> 475136 // 600
        (100.0, 100.0, 75.0, 791),
    ],
)
def test_expected_output_is_capped_profile_mean(
    output_cap: float, mu: float, sigma: float, batch: int
) -> None:
    instance = make_instance()
    profile = make_profile(step_s=(0.02,), batch_sizes=(1,), max_batch_size=1024)
    estimator = RwtEstimator(EstimatorConfig(), Fleet.of([instance], [profile]))
    rates = estimator.rates(make_group(prompt_tokens=500.0, output_cap=output_cap), instance)
    assert rates is not None
    assert rates.output_tokens_mean == pytest.approx(mu)
    assert rates.output_tokens_std == pytest.approx(sigma)
    # The capped output shortens each sequence's KV footprint, so more fit (KV-bound here).
    assert rates.batch_size == batch
    assert rates.throughput_tokens_per_s == pytest.approx(batch / 0.02)
    assert rates.prefill_s == pytest.approx(P)
    assert rates.load_s == 10.0


@pytest.mark.parametrize(
    ("mean", "std", "alignment"),
    [
        (200.0, 100.0, 1.5),  # (40000 - 10000) / 400 = 75 steps x 0.02
        (200.0, 0.0, 2.0),  # deterministic: half the output, 100 steps x 0.02
        (200.0, 200.0, 0.0),  # CV = 1: no offset
        (200.0, 300.0, 0.0),  # CV > 1: clamped at zero, never negative
    ],
)
def test_alignment(mean: float, std: float, alignment: float) -> None:
    estimator, instance = _estimator(output_std=std)
    rates = estimator.rates(_group(), instance)
    assert rates is not None
    assert rates.alignment_s == pytest.approx(alignment)


# --- group cost ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "occupancy", "ttft_lag", "completion_lag"),
    [
        # n = 10 > B: the last waits on n - B = 6 decode works.
        # occupancy 10 x (0.05 + 1.0); ttft 10 x 0.05 + 6 x 1.0 = 6.5, std sqrt(6 x 0.25);
        # completion adds 4.0 own decode, std sqrt(1.5 + 2.0^2).
        (10, 10.5, 6.5 + Z95 * math.sqrt(1.5), 10.5 + Z95 * math.sqrt(5.5)),
        # n = 3 <= B: everyone starts at once; only prefill before the first token, no spread.
        (3, 3.15, 0.15, 0.15 + OWN + Z95 * OWN_STD),
        # n = B exactly: still no one waits on decode work.
        (4, 4.2, 0.2, 0.2 + OWN + Z95 * OWN_STD),
    ],
)
def test_group_cost_hand_computed(
    size: int, occupancy: float, ttft_lag: float, completion_lag: float
) -> None:
    estimator, instance = _estimator()
    cost = estimator.group_cost(_group("g7", size), instance)
    assert cost is not None
    assert (cost.group_id, cost.instance_id) == ("g7", "i0")
    assert cost.occupancy_s == pytest.approx(occupancy)  # n x (prefill + mu / Theta)
    assert cost.ttft_lag_s == pytest.approx(ttft_lag)
    assert cost.completion_lag_s == pytest.approx(completion_lag)
    assert cost.load_s == LOAD


@pytest.mark.parametrize("size", [3, 10, 25])
def test_group_cost_agrees_with_queue_walk_on_busy_engine(size: int) -> None:
    # On a busy engine (no idle-start alignment) the last member's percentile TTFT in the
    # queue walk is the busy time plus the group's ttft lag: two code paths, one answer.
    estimator, instance = _estimator()
    group = _group(size=size)
    cost = estimator.group_cost(group, instance)
    assert cost is not None
    est = estimator.estimate_queue([group], instance, busy_s=7.0)
    assert est.groups[0].ttft_p_s == pytest.approx(7.0 + cost.ttft_lag_s)
    assert est.groups[0].completion_p_s == pytest.approx(7.0 + cost.completion_lag_s)


# --- estimate_queue -----------------------------------------------------------------------


def test_first_batch_on_idle_engine_waits_only_for_prefill() -> None:
    estimator, instance = _estimator()
    est = estimator.estimate_queue([_group(size=8)], instance)
    # Requests 0..B-1 get a slot at once: TTFT is the prefills admitted so far, (j + 1) x p.
    expected_first = np.array([1, 2, 3, 4]) * P
    np.testing.assert_allclose(est.ttft_mean_s[:B], expected_first)
    np.testing.assert_allclose(est.ttft_p_s[:B], expected_first)  # nothing uncertain ahead
    # Request B waits for one decode work and, on an idle start, the alignment offset:
    # 5 x 0.05 + 1.0 + 1.5.
    assert est.ttft_mean_s[B] == pytest.approx(5 * P + D + ALIGN)
    assert est.groups[0].start_s == pytest.approx(0.0)  # the first member is admitted now


def test_busy_engine_delays_and_skips_alignment() -> None:
    estimator, instance = _estimator()
    est = estimator.estimate_queue([_group(size=8)], instance, busy_s=5.0)
    # Everything waits for the 5 s of work already there.
    np.testing.assert_allclose(est.ttft_mean_s[:B], 5.0 + np.array([1, 2, 3, 4]) * P)
    # A running engine is in steady state: no idle-start alignment, 5 + 0.25 + 1.0.
    assert est.ttft_mean_s[B] == pytest.approx(5.0 + 5 * P + D)


@pytest.mark.parametrize("load_s", [0.0, 10.0, 37.5])
def test_swap_between_models_adds_load_time(load_s: float) -> None:
    # CV = 1 removes the alignment offset, so the swap's cost is exactly isolated.
    estimator, instance = _estimator(output_std=200.0, load_s=load_s, models=("m7b", "other"))
    first = _group("a", size=8)
    same_model = estimator.estimate_queue([first, _group("a2", size=8)], instance)
    swapped = estimator.estimate_queue([first, _group("b", size=8, model="other")], instance)
    assert (same_model.swaps, swapped.swaps) == (0, 1)
    assert [g.swap_before for g in swapped.groups] == [False, True]
    # The first group is unaffected by what follows it.
    np.testing.assert_allclose(swapped.ttft_mean_s[:8], same_model.ttft_mean_s[:8])
    # Without a swap the second group's last member waits on 8 + 8 - B decode works; with
    # one it waits for the first group to drain (8 works) then for its own 8 - B: the same
    # work, plus the load. Variance matches too, so the percentile moves by the load alone.
    a2, b = same_model.groups[1], swapped.groups[1]
    assert b.ttft_mean_s - a2.ttft_mean_s == pytest.approx(load_s)
    assert b.ttft_p_s - a2.ttft_p_s == pytest.approx(load_s)
    assert b.completion_p_s - a2.completion_p_s == pytest.approx(load_s)
    # The new model starts only after all earlier work: 8 prefills + load + 8 decode works.
    assert b.start_s == pytest.approx(8 * P + load_s + 8 * D)


@pytest.mark.parametrize(
    ("loaded_model", "extra_s"),
    [
        ("m7b", 0.0),  # the right model is already loaded
        ("other", LOAD),  # another model is loaded: swap first
        (None, LOAD),  # an empty engine must load too
    ],
)
def test_first_group_pays_load_when_model_differs(loaded_model: str | None, extra_s: float) -> None:
    estimator, baseline = _estimator()
    instance = make_instance(loaded_model=loaded_model)
    group = _group(size=8)
    ref = estimator.estimate_queue([group], baseline)
    est = estimator.estimate_queue([group], instance)
    assert est.swaps == (1 if extra_s else 0)
    # Every request shifts by exactly the load time (both start idle, so alignment matches).
    np.testing.assert_allclose(est.ttft_mean_s - ref.ttft_mean_s, extra_s, atol=1e-12)
    np.testing.assert_allclose(est.completion_p_s - ref.completion_p_s, extra_s, atol=1e-12)


def test_request_ids_in_queue_order() -> None:
    estimator, instance = _estimator()
    est = estimator.estimate_queue([_group("x", 2), _group("y", 3)], instance)
    assert est.request_ids == ("x.0", "x.1", "y.0", "y.1", "y.2")
    assert len(est.ttft_mean_s) == 5  # one estimate per request
    assert [g.group_id for g in est.groups] == ["x", "y"]


def test_empty_queue() -> None:
    estimator, instance = _estimator()
    est = estimator.estimate_queue([], instance)
    assert est.groups == ()
    assert est.ttft_p_s.shape == (0,)


def _mixed_queue() -> tuple[RequestGroup, ...]:
    # Two runs of m7b around a swap to another model.
    return (_group("a", 10), _group("b", 6, model="other"), _group("c", 12))


@pytest.mark.parametrize("percentile", [0.9, 0.95, 0.99])
def test_percentiles_at_least_means(percentile: float) -> None:
    estimator, instance = _estimator(percentile=percentile, models=("m7b", "other"))
    est = estimator.estimate_queue(_mixed_queue(), instance, busy_s=2.0)
    assert np.all(est.ttft_p_s >= est.ttft_mean_s)
    assert np.all(est.completion_p_s >= est.completion_mean_s)
    # A request completes after its first token.
    assert np.all(est.completion_mean_s > est.ttft_mean_s)
    # Past the first batch there is uncertainty ahead, so the percentile is strictly above.
    assert np.all(est.ttft_p_s[B:] > est.ttft_mean_s[B:])
    for g in est.groups:
        assert g.ttft_p_s >= g.ttft_mean_s
        assert g.completion_p_s >= g.completion_mean_s


def test_higher_percentile_is_later() -> None:
    queue = _mixed_queue()
    p = {}
    for q in (0.9, 0.95, 0.99):
        estimator, instance = _estimator(percentile=q, models=("m7b", "other"))
        p[q] = estimator.estimate_queue(queue, instance).ttft_p_s
    # z grows with the percentile: 1.28 < 1.64 < 2.33 standard deviations.
    assert np.all(p[0.9][B:] < p[0.95][B:])
    assert np.all(p[0.95][B:] < p[0.99][B:])


# --- violations ---------------------------------------------------------------------------

NOW = 100.0
GENEROUS = _group("ok", 8, deadline_at_s=1e9)


def _deadline(at: str, mean_s: float, p_s: float) -> float:
    return {
        "before-mean": mean_s - 1.0,
        "between-mean-and-p": (mean_s + p_s) / 2,
        "at-p": p_s,
        "after-p": p_s + 1.0,
    }[at]


@pytest.mark.parametrize(
    ("ttft_at", "completion_at", "expected_targets"),
    [
        ("before-mean", None, ["ttft"]),  # late even on average
        ("between-mean-and-p", None, ["ttft"]),  # on time on average, but not at p95
        ("at-p", None, []),  # exactly on the deadline is on time
        ("after-p", None, []),  # generous: no violation
        ("after-p", "between-mean-and-p", ["completion"]),  # first token fine, finish late
        ("after-p", "after-p", []),  # both on time
        ("before-mean", "before-mean", ["ttft", "completion"]),  # both late, both reported
    ],
)
def test_violations(ttft_at: str, completion_at: str | None, expected_targets: list[str]) -> None:
    estimator, instance = _estimator()
    # Deadlines do not change the estimate, so place them around the probe's predicted times.
    ref = estimator.estimate_queue([GENEROUS, _group("probe", 8)], instance).groups[1]
    ttft_p = NOW + ref.ttft_p_s
    done_p = NOW + ref.completion_p_s
    ttft_deadline = _deadline(ttft_at, NOW + ref.ttft_mean_s, ttft_p)
    completion_deadline = (
        None
        if completion_at is None
        else _deadline(completion_at, NOW + ref.completion_mean_s, done_p)
    )
    probe = _group(
        "probe", 8, deadline_at_s=ttft_deadline, completion_deadline_at_s=completion_deadline
    )
    queue = [GENEROUS, probe]
    found = estimator.violations(queue, estimator.estimate_queue(queue, instance), NOW)
    # Only the probe can be late; the generous group ahead of it never is.
    assert all(v.group_id == "probe" and v.instance_id == "i0" for v in found)
    assert [v.target for v in found] == expected_targets
    for v in found:
        predicted, deadline = (
            (ttft_p, ttft_deadline) if v.target == "ttft" else (done_p, completion_deadline)
        )
        # Judged at the percentile, in absolute time (now + relative estimate).
        assert v.predicted_at_s == pytest.approx(predicted)
        assert v.deadline_at_s == deadline
        assert v.late_s == pytest.approx(predicted - deadline)
        assert v.late_s > 0


def test_violations_shift_with_now() -> None:
    # The same queue judged later is later in absolute time: a deadline met now is missed
    # once the queue has sat still for longer than its slack.
    estimator, instance = _estimator()
    group = _group("g", 8, deadline_at_s=50.0)
    est = estimator.estimate_queue([group], instance)
    slack = 50.0 - est.groups[0].ttft_p_s  # time left if judged at now = 0
    assert estimator.violations([group], est, now_s=0.0) == ()
    late = estimator.violations([group], est, now_s=slack + 1.0)
    assert [v.target for v in late] == ["ttft"]
    assert late[0].late_s == pytest.approx(1.0)


def test_a_swap_to_a_model_asleep_in_the_tier_is_priced_as_its_wake() -> None:
    """The planner prices a swap by tier (the end-to-end vLLM test may see the idle wake serve
    before any plan prices it): m7b asleep on an instance serving `other` costs the profile's
    wake_s, not its load_s; and on a queue that goes to m7b, back to `other` and to m7b again,
    the tier keeps the model left, so after a first cold load every move is a wake."""
    wake_s = 0.5
    profiles = [
        replace(
            make_profile(m, step_s=(0.02,), batch_sizes=(1,), max_batch_size=B, load_s=LOAD),
            wake_s=wake_s,
        )
        for m in ("m7b", "other")
    ]
    asleep = replace(
        make_instance(loaded_model="other"), standby_models=("m7b",), standby_capacity=1
    )
    cold = replace(asleep, standby_models=())
    estimator = RwtEstimator(EstimatorConfig(), Fleet.of([asleep], profiles))
    group = _group("a", size=8)
    woken = estimator.estimate_queue([group], asleep)
    loaded = estimator.estimate_queue([group], cold)
    np.testing.assert_allclose(loaded.ttft_mean_s - woken.ttft_mean_s, LOAD - wake_s, atol=1e-12)
    there_and_back = [group, _group("b", size=8, model="other"), _group("c", size=8)]
    est = estimator.estimate_queue(there_and_back, asleep)
    again = estimator.estimate_queue(there_and_back, cold)
    assert est.swaps == again.swaps == 3  # three wakes; a cold load and two wakes
    assert again.groups[2].start_s - est.groups[2].start_s == pytest.approx(LOAD - wake_s)
