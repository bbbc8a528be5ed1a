"""Random scenarios (qlm/sim/fuzz): a function of the seed, always valid within their bounds,
every model servable from the start, and they simulate; the capacity estimate and its LP."""

from __future__ import annotations

from pathlib import Path

import pytest

from qlm.config import ConfigError
from qlm.sim.fuzz import SIZES, draw_scenario, parse_random_name
from qlm.sim.fuzz.choices import fitting_profiles
from qlm.sim.fuzz.throughput import LengthMoments, fleet_capacity_per_s, request_cost_s
from qlm.sim.scenario import load_scenario, random_scenario
from qlm.sim.simulate import simulate
from qlm.sim.traces import load_trace
from qlm.types import DEFAULT_GPU_TYPES

ROOT = Path(__file__).resolve().parents[2]
SEEDS = range(20)


def test_same_seed_same_scenario_and_requests() -> None:
    a, b = random_scenario(5), random_scenario(5)
    assert a == b
    assert a.requests()[:50] == b.requests()[:50]


def test_different_seeds_differ() -> None:
    drawn = [random_scenario(seed).model_dump_json() for seed in range(8)]
    assert len(set(drawn)) == len(drawn)


@pytest.mark.parametrize("seed", SEEDS)
def test_scenarios_within_bounds(seed: int) -> None:
    size = SIZES["quick"]
    draw = draw_scenario(seed)
    scenario = random_scenario(seed)
    fleet = scenario.fleet()
    assert size.min_instances <= len(fleet.instances) <= size.max_instances
    assert 1 <= len(scenario.models) <= size.max_models
    assert size.min_load <= draw.load_factor <= size.max_load
    assert size.min_window_s <= draw.window_s <= size.max_window_s
    assert 0.99 * size.min_requests <= draw.expected_requests <= size.max_requests
    loaded = {i.loaded_model for i in fleet.instances}
    assert set(scenario.models) <= loaded  # every model is served from the start
    for inst in fleet.instances:
        assert inst.loaded_model is not None
        assert fleet.can_serve(inst, inst.loaded_model)
    classes = {c.name for c in scenario.slo_classes}
    assert set(draw.class_shares) <= classes
    assert sum(draw.model_shares.values()) == pytest.approx(1.0)
    requests = scenario.requests()
    assert 0 < len(requests) <= 2 * size.max_requests  # gamma noise around the expectation
    assert all(r.arrival_at_s <= draw.window_s for r in requests)
    assert all(
        r.prompt_tokens + r.max_output_tokens
        <= fleet.profiles[(r.model, i.gpu_type)].kv_capacity_tokens(i.gpu_memory_bytes)
        for r in requests[:200]
        for i in fleet.instances
        if i.loaded_model == r.model
    )


@pytest.mark.parametrize("seed", [0, 3, 7])
def test_tiny_scenarios_simulate_under_fcfs(seed: int) -> None:
    scenario = random_scenario(seed, "tiny")
    requests = scenario.requests()
    assert len(requests) <= 2 * SIZES["tiny"].max_requests
    result = simulate(scenario.fleet(), requests, "fcfs", scenario.config, scenario.seed)
    assert result.end_s >= max(r.arrival_at_s for r in requests)


def test_random_name_loads_like_a_file() -> None:
    assert load_scenario(Path("random:4")) == random_scenario(4)
    assert load_scenario(Path("random:4:tiny")) == random_scenario(4, "tiny")
    assert parse_random_name("sims/wa.yaml") is None
    for bad in ("random:x", "random:3:huge", "random:-1"):
        with pytest.raises(ConfigError):
            load_scenario(Path(bad))


def test_request_cost_matches_the_measured_capacities() -> None:
    """sims/README.md measured these by simulation; the estimate is within 2-6% of each."""
    azure = LengthMoments.of(load_trace(ROOT / "sims/data/azure_llm_2023_conv.csv", "azure"))
    measured = {
        ("mistral-7b", "A100"): 10.75,
        ("mistral-7b", "A10"): 2.90,
        ("vicuna-13b", "A100"): 3.28,
        ("llama-70b", "A100"): 2.26,
    }
    for key, rate in measured.items():
        profile = fitting_profiles()[key]
        cost_s = request_cost_s(profile, DEFAULT_GPU_TYPES[key[1]].memory_bytes, azure)
        assert 1.0 / cost_s == pytest.approx(rate, rel=0.06)


def test_fleet_capacity_lp() -> None:
    # one model: the sum of the instances' rates
    assert fleet_capacity_per_s([{"a": 2.0}, {"a": 3.0}], {"a": 1.0}) == pytest.approx(5.0)
    # the shared instance gives x of its time to a: R/2 = 1 + 3x = 2 + 3(1 - x) -> R = 6
    rates = [{"a": 1.0}, {"b": 2.0}, {"a": 3.0, "b": 3.0}]
    assert fleet_capacity_per_s(rates, {"a": 0.5, "b": 0.5}) == pytest.approx(6.0)
    # a model nobody can run: no capacity
    assert fleet_capacity_per_s([{"a": 1.0}], {"a": 0.5, "b": 0.5}) == 0.0
