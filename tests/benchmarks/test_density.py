"""benchmarks/density: the long-tail scenario is what its docstring says (model mix, Zipf
shares, two pools, the standby tier on or off), and the bisection finds the least count."""

from __future__ import annotations

from benchmarks.density.run import _least, grid_rows, simulated
from benchmarks.density.scenario import long_tail, model_names, popularity
from qlm.causes import MissCause
from qlm.sim.result import OutcomeState


def test_the_model_mix_and_the_zipf_shares() -> None:
    names = model_names(16)
    sizes = [name.split("-")[0] for name, _ in names]
    assert (sizes.count("m7b"), sizes.count("m13b"), sizes.count("m70b")) == (10, 4, 2)
    shares = popularity(names, seed=3, zipf_s=1.1)
    ranked = sorted(shares.values(), reverse=True)
    assert abs(sum(ranked) - 1.0) < 1e-9
    assert ranked[0] / ranked[1] == 2**1.1  # Zipf: rank 1 over rank 2
    assert popularity(names, seed=4, zipf_s=1.1) != shares  # the ranking is seeded


def test_the_scenario_places_models_by_popularity_on_their_pools() -> None:
    scenario = long_tail(0, models=8, peak_rate=2.0)
    groups = scenario.fleet_config.instances
    assert {g.gpu_type for g in groups if g.model and g.model.startswith("m70b")} == {"A100"}
    assert {g.gpu_type for g in groups if g.model and not g.model.startswith("m70b")} == {"H100"}
    assert scenario.engine.standby_models == 3
    fleet = scenario.fleet()
    assert all(p.wake_s is not None for p in fleet.profiles.values())
    cold = long_tail(0, models=8, peak_rate=2.0, standby=False)
    assert cold.engine.standby_models == 0
    assert all(p.wake_s is None for p in cold.fleet().profiles.values())
    requests = scenario.requests(0)
    assert {r.slo_class for r in requests} == {"interactive", "batch"}
    assert max(r.arrival_at_s for r in requests) <= 1200.0


def test_the_bisection_finds_the_least_count_that_meets_the_target() -> None:
    calls: list[int] = []

    def value(k: int) -> float:
        calls.append(k)
        return 1.0 if k >= 7 else 0.5

    assert _least(value, 0, 24, 0.99) == 7
    assert len(calls) <= 7
    assert _least(lambda k: 0.5, 0, 24, 0.99) is None
    # not monotonic: 5 meets, 6 and 7 do not, 8 and up do; the bisection alone answers 8
    bumpy = {5: 1.0, 6: 0.98, 7: 0.98}
    assert _least(lambda k: bumpy.get(k, 1.0 if k >= 8 else 0.5), 0, 24, 0.99) == 8
    assert _least(lambda k: bumpy.get(k, 1.0 if k >= 8 else 0.5), 0, 24, 0.99, below=3) == 5


def test_the_grid_counts_every_miss_under_one_cause() -> None:
    scenario = long_tail(0, models=6, peak_rate=1.0)
    requests = scenario.requests(0)
    rows = grid_rows(scenario, requests, "qlm-edf", 0, ["1/1", "4/1"])
    assert [r["gpus"] for r in rows] == [5, 8]
    causes = {c.value for c in MissCause}
    for row in rows:
        missed = sum(n for key, n in row.items() if key in causes)
        assert missed == round((1 - row["attainment"]) * len(requests))
    # one H100 for five small models misses more than four do
    assert rows[0]["attainment"] < rows[1]["attainment"]


def test_shared_h100s_count_once_and_serve_the_small_models_in_halves() -> None:
    scenario = long_tail(0, models=6, peak_rate=1.0, slices=2)
    groups = scenario.fleet_config.instances
    assert {g.slices for g in groups if g.gpu_type == "H100"} == {2}
    assert {g.slices for g in groups if g.gpu_type == "A100"} == {1}
    sized = scenario.with_fleet_counts({"H100": 2, "A100": 1})
    h100 = [i for i in sized.fleet().instances if i.gpu_type == "H100"]
    assert len(h100) == 4
    assert len({i.device for i in h100}) == 2
    requests = scenario.requests(0)
    (row,) = grid_rows(sized, requests, "qlm-edf", 0, ["2/1"])
    assert row["gpus"] == 6  # 2 H100 + 4 A100 GPUs, not 4 + 4
    assert row["attainment"] > 0.5


def test_shared_a100_sets_hold_two_70b_models_beside_each_other() -> None:
    shares = (0.5, 0.25, 0.25)
    scenario = long_tail(0, models=8, peak_rate=1.0, slices=3, kv_pool=True,
                         slice_memory=shares, large_memory=(0.5, 0.5))  # fmt: skip
    sized = scenario.with_fleet_counts({"H100": 1, "A100": 1})
    fleet = sized.fleet()
    a100 = [i for i in fleet.instances if i.gpu_type == "A100"]
    assert len(a100) == 2
    assert len({i.device for i in a100}) == 1
    assert all(i.kv_pool for i in a100)
    # each half of a 4-GPU A100 set holds a 70B model's weights, so both fit at once
    assert all(fleet.can_serve(i, "m70b-01") for i in a100)
    h100 = [i for i in fleet.instances if i.gpu_type == "H100"]
    assert sum(i.gpus for i in fleet.instances) == 5  # 1 H100 + 4 A100, each GPU once
    assert len(h100) == 3


def test_a_run_drains_so_no_request_is_judged_before_its_deadline() -> None:
    scenario = long_tail(0, models=6, peak_rate=1.0).with_fleet_counts({"H100": 4, "A100": 1})
    requests = scenario.requests(0)
    last = max(r.arrival_at_s for r in requests)
    assert last > 1190.0  # arrivals run to the horizon (1,200 s)
    result = simulated(scenario, requests, "qlm-edf", 0)
    assert result.end_s > last
    assert not [o for o in result.outcomes if o.state is OutcomeState.UNFINISHED]


def test_a_wake_for_a_backlog_that_outlasts_it_keeps_more_promises() -> None:
    """qlm_dispatch.py `_backlog_risk`: with it, an instance wakes a model from its standby
    tier when that model's pool is overrun by a burst (it drops requests due before the wake
    is ready, which the queued count leaves out). Off, the burst's model stays on its pool
    and its next arrivals miss too."""
    scenario = long_tail(2, models=8, peak_rate=6.0, slices=3, kv_pool=True,
                         slice_memory=(0.5, 0.25, 0.25))  # fmt: skip
    requests = scenario.requests(2)
    off, on = (
        grid_rows(scenario, requests, "qlm-edf", 2, ["2/2"], {"wake_for_backlog": wake})[0]
        for wake in (False, True)
    )
    # Since the swap gate prices a last instance's absence (decision.py `_lost`), the option
    # keeps 15 more of these 4,965 requests (98.95 % against 98.65 %);
    # on grid 2/2 of seeds 0-5 it gains 0 to 0.3 points, but loses 0.9 on seed 5 (closing note)
    assert on.get("queued", 0) < off.get("queued", 0)
    assert on["attainment"] > off["attainment"]
