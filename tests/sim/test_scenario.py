"""Scenario files: validation errors name file:line: field; fleets, requests and the derived
scenarios (rate scale, fleet counts, costs); the shipped sims/ files load."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from qlm.config import ConfigError
from qlm.sim.scenario import Scenario, load_scenario
from qlm.types import DEFAULT_GPU_TYPES, GIB

ROOT = Path(__file__).resolve().parents[2]
SIMS = ROOT / "sims"
AZURE = SIMS / "data" / "azure_llm_2023_conv.csv"

PROFILES = """\
  profiles:
    - {model: m7b, gpu_type: A100, weight_bytes: 15032385536, kv_bytes_per_token: 131072,
       decode_table: {batch_sizes: [1, 64], step_s: [0.02, 0.04]}, prefill_tokens_per_s: 10000,
       output_tokens_mean: 200, output_tokens_std: 100, load_s: 10}
    - {model: m7b, gpu_type: A10, weight_bytes: 15032385536, kv_bytes_per_token: 131072,
       decode_table: {batch_sizes: [1, 64], step_s: [0.03, 0.06]}, prefill_tokens_per_s: 5000,
       output_tokens_mean: 200, output_tokens_std: 100, load_s: 10}
    - {model: big, gpu_type: A100, gpu_count: 2, weight_bytes: 107374182400,
       kv_bytes_per_token: 327680, decode_table: {batch_sizes: [1, 64], step_s: [0.04, 0.08]},
       prefill_tokens_per_s: 3000, output_tokens_mean: 200, output_tokens_std: 100, load_s: 60}
"""

BASE = f"""\
name: tiny
description: a test scenario
seed: 3
fleet:
  instances:
    - {{gpu_type: A100, count: 3, model: m7b}}
    - {{gpu_type: A100, count: 1, model: big}}
    - {{gpu_type: A10, count: 2, model: m7b}}
{PROFILES}workload:
  - name: chat
    arrivals: {{process: poisson, rate_per_s: 2}}
    duration_s: 300
    models: {{m7b: 3, big: 1}}
    classes: {{interactive: 1}}
    lengths: {{source: trace, path: data/azure.csv}}
  - name: backlog
    arrivals: {{process: backlog}}
    count: 200
    models: {{m7b: 1}}
    classes: {{batch-2: 1}}
    lengths: {{source: fixed, prompt_tokens: 1000, output_tokens: 300}}
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "azure.csv").write_bytes(AZURE.read_bytes())
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def scenario(tmp_path: Path) -> Scenario:
    return load_scenario(write(tmp_path, BASE))


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    return str(info.value)


def line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        (
            "classes: {interactive: 1}",
            "classes: {urgent: 1}",
            "workload.0.classes.urgent",
            "unknown SLO class",
        ),
        (
            "rate_per_s: 2}",
            "rate_per_s: -2}",
            "workload.0.arrivals.poisson.rate_per_s",
            "greater than 0",
        ),
        (
            "{gpu_type: A10, count: 2",
            "{gpu_type: V100, count: 2",
            "fleet.instances.2",
            "unknown gpu_type",
        ),
        (
            "models: {m7b: 3, big: 1}",
            "models: {m7b: 3, huge: 1}",
            "workload.0.models.huge",
            "no GPU type",
        ),
        (
            "{gpu_type: A10, count: 2, model: m7b}",
            "{gpu_type: A10, count: 2, model: big}",
            "fleet.instances.2.model",
            "cannot run on",
        ),
        (
            "path: data/azure.csv",
            "path: data/missing.csv",
            "workload.0.lengths.trace.path",
            "file not found",
        ),
        ("duration_s: 300", "duraton_s: 300", "workload.0.duraton_s", "Extra inputs"),
        ("name: backlog", "name: chat", "workload.1.name", "used twice"),
        ("count: 200", "count: 0", "workload.1.count", "greater than or equal to 1"),
    ],
)
def test_errors_name_the_file_line_and_field(
    tmp_path: Path, old: str, new: str, field: str, message: str
) -> None:
    assert old in BASE
    text = BASE.replace(old, new, 1)
    error = error_of(tmp_path, text)
    line = BASE[: BASE.index(old)].count("\n") + 1
    assert f"scenario.yaml:{line}: {field}" in error
    assert message in error


def test_the_qlm_block_takes_no_slo_classes(tmp_path: Path) -> None:
    text = BASE + "qlm:\n  slo_classes: [{name: interactive, ttft_s: 20}]\n"
    error = error_of(tmp_path, text)
    assert f"scenario.yaml:{line_of(text, 'slo_classes')}: qlm.slo_classes" in error
    assert "top level" in error


def test_invalid_yaml_and_missing_fields(tmp_path: Path) -> None:
    assert "invalid YAML" in error_of(tmp_path, "name: [unclosed\n")
    error = error_of(tmp_path, "name: x\n")
    assert "fleet: Field required" in error
    assert "workload: Field required" in error


# --- the fleet -------------------------------------------------------------------------------


def test_fleet_instances_memory_and_gpu_counts(scenario: Scenario) -> None:
    fleet = scenario.fleet()
    ids = [i.id for i in fleet.instances]
    assert ids == ["a100-m7b-0", "a100-m7b-1", "a100-m7b-2", "a100-big-0", "a10-m7b-0", "a10-m7b-1"]
    big = fleet.instance("a100-big-0")
    assert (big.gpu_count, big.loaded_model, big.gpu_memory_bytes) == (2, "big", 80 * GIB)
    assert fleet.instance("a10-m7b-0").gpu_memory_bytes == 24 * GIB
    assert set(fleet.profiles) == {("m7b", "A100"), ("m7b", "A10"), ("big", "A100")}
    assert scenario.fleet_counts() == {"A100": 4, "A10": 2}
    # 3 x 1 x 3.7 + 1 x 2 x 3.7 + 2 x 1 x 1.0
    assert scenario.fleet_cost_per_hour() == pytest.approx(20.5)


def test_with_fleet_counts_shares_a_type_among_its_groups(scenario: Scenario) -> None:
    bigger = scenario.with_fleet_counts({"A100": 8, "A10": 0})
    assert bigger.fleet_counts() == {"A100": 8, "A10": 0}
    models = [i.loaded_model for i in bigger.fleet().instances]
    assert models.count("m7b") == 6
    assert models.count("big") == 2
    one = scenario.with_fleet_counts({"A100": 1})
    assert [i.loaded_model for i in one.fleet().instances] == ["m7b", "m7b", "m7b"]
    with pytest.raises(ValueError, match="not in the fleet"):
        scenario.with_fleet_counts({"H100": 2})
    assert scenario.fleet_counts() == {"A100": 4, "A10": 2}  # unchanged


def test_template_groups_with_count_zero(tmp_path: Path) -> None:
    text = BASE.replace(
        "{gpu_type: A10, count: 2, model: m7b}", "{gpu_type: A10, count: 0, model: m7b}"
    )
    scenario = load_scenario(write(tmp_path, text))
    assert scenario.fleet_counts() == {"A100": 4, "A10": 0}
    assert scenario.with_fleet_counts({"A10": 3}).fleet_counts()["A10"] == 3


def test_gpu_costs_override_the_defaults(scenario: Scenario) -> None:
    cheap = scenario.with_gpu_costs({"A100": 2.0})
    assert cheap.gpu_cost_per_hour("A100") == 2.0
    assert cheap.gpu_cost_per_hour("A10") == 1.0
    assert cheap.fleet_cost_per_hour() == pytest.approx(3 * 2.0 + 2 * 2.0 + 2 * 1.0)


# --- requests and configuration ------------------------------------------------------------


def test_requests_are_deterministic_per_seed(scenario: Scenario) -> None:
    a = scenario.requests()
    assert a == scenario.requests(3)  # the scenario's seed
    assert a == scenario.requests()
    assert a != scenario.requests(4)
    assert [r.arrival_at_s for r in a] == sorted(r.arrival_at_s for r in a)
    backlog = [r for r in a if r.id.startswith("backlog-")]
    assert len(backlog) == 200
    assert all(r.arrival_at_s == 0.0 and r.max_output_tokens == 300 for r in backlog)
    chat = [r for r in a if r.id.startswith("chat-")]
    assert {r.model for r in chat} == {"m7b", "big"}


def test_rate_scale_changes_duration_streams_only(scenario: Scenario) -> None:
    base = scenario.requests()
    doubled = scenario.with_rate_scale(2.0).requests()
    chat = sum(r.id.startswith("chat-") for r in base)
    chat2 = sum(r.id.startswith("chat-") for r in doubled)
    assert chat2 == pytest.approx(2 * chat, rel=0.15)
    assert sum(r.id.startswith("backlog-") for r in doubled) == 200
    with pytest.raises(ValueError, match="> 0"):
        scenario.with_rate_scale(0.0)


def test_config_carries_the_scenario_classes(tmp_path: Path) -> None:
    text = BASE.replace("classes: {interactive: 1}", "classes: {chat: 1}").replace(
        "classes: {batch-2: 1}", "classes: {bulk: 1}"
    ) + textwrap.dedent(
        """\
            slo_classes:
              - {name: chat, ttft_s: 5, priority: 1}
              - {name: bulk, ttft_s: 600}
            qlm:
              planner: {time_limit_s: 0.3}
            """
    )
    scenario = load_scenario(write(tmp_path, text))
    config = scenario.config
    assert [c.name for c in config.slo_classes] == ["chat", "bulk"]
    assert config.default_slo_class == "chat"
    assert config.planner.time_limit_s == 0.3
    chat = next(r for r in scenario.requests() if r.slo_class == "chat")
    assert chat.ttft_deadline_at_s == pytest.approx(chat.arrival_at_s + 5.0)


def test_horizon_drops_late_arrivals(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, BASE + "horizon_s: 100\n"))
    assert max(r.arrival_at_s for r in scenario.requests()) < 100.0


# --- shipped scenarios ---------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(SIMS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_scenarios_load(path: Path) -> None:
    scenario = load_scenario(path)
    fleet = scenario.fleet()
    assert fleet.instances
    assert all(fleet.can_serve(i, i.loaded_model) for i in fleet.instances if i.loaded_model)
    assert scenario.gpu_types
    assert set(scenario.gpu_types) <= set(DEFAULT_GPU_TYPES)  # priced without gpu_types
    first = next(scenario.iter_requests())
    assert first.model in scenario.models


def test_full_and_quick_scenarios_come_in_pairs() -> None:
    names = {p.stem for p in SIMS.glob("*.yaml")}
    assert {"wa", "wb", "wc"} <= names
    for name in ("wa", "wb", "wc"):
        assert f"{name}-quick" in names


def test_rate_scale_in_the_file_equals_with_rate_scale(tmp_path: Path, scenario: Scenario) -> None:
    scaled_file = load_scenario(write(tmp_path, BASE + "rate_scale: 2\n"))
    assert scaled_file.rate_scale == 2.0
    assert scaled_file.requests() == scenario.with_rate_scale(2.0).requests()
    assert scaled_file.with_rate_scale(0.5).requests() == scenario.requests()


# --- engine settings ---------------------------------------------------------------------------


def test_the_engine_section_sets_every_simulated_engine(tmp_path: Path) -> None:
    from qlm.sim.simulate_cli import run_policies

    small = load_scenario(write(tmp_path, BASE + "horizon_s: 30\n"))
    assert small.engine.waiting_order == "fcfs"
    text = BASE + "horizon_s: 30\nengine: {chunk_tokens: 16, waiting_order: prefix-groups}\n"
    tuned = load_scenario(write(tmp_path, text))
    assert (tuned.engine.chunk_tokens, tuned.engine.waiting_order) == (16, "prefix-groups")
    # 16 prompt tokens an iteration instead of 2,048: first tokens come later
    plain = run_policies(small, ["fcfs"], 0, progress=False)[0]
    slow = run_policies(tuned, ["fcfs"], 0, progress=False)[0]
    assert slow.ttft_p50_s > 2 * plain.ttft_p50_s


def test_a_bad_engine_setting_names_its_field_and_line(tmp_path: Path) -> None:
    text = BASE + "engine: {waiting_order: lifo}\n"
    message = error_of(tmp_path, text)
    assert f":{line_of(text, 'waiting_order: lifo')}:" in message
    assert "engine.waiting_order" in message
