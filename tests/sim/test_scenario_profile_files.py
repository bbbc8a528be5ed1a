"""Scenarios that read profile files (what `qlm profile` writes) and define their own GPU
types: the simulator serves with the measured profile, and bad references name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qlm.cli import main
from qlm.config import ConfigError
from qlm.config.profile_files import load_profile, packaged_profiles, save_profile
from qlm.perf.profile import GIB, Profile
from qlm.perf.step import StepTime
from qlm.sim.scenario import load_scenario

MEASURED = StepTime(
    base_s=2.5e-3, per_prefill_token_s=9e-5, per_decode_seq_s=2e-4, per_context_token_s=4e-7
)

SCENARIO = """\
name: measured
seed: 3
slo_classes:
  - {name: interactive, ttft_s: 2, lateness_weight: 100, priority: 2}
fleet:
  gpu_types: {cpu: {memory_gib: 1, cost_per_hour: 0.1}}
  profile_files: [profiles]
  instances:
    - {gpu_type: cpu, count: 1, model: tiny-a}
workload:
  - name: chat
    arrivals: {process: poisson, rate_per_s: 2}
    count: 40
    models: {tiny-a: 1}
    classes: {interactive: 1}
    lengths: {source: fixed, prompt_tokens: 200, output_tokens: 50}
"""


def tiny_profile() -> Profile:
    """A packaged profile recast as a measured CPU profile of a tiny model."""
    base = packaged_profiles()[0]
    return Profile(
        model="tiny-a",
        gpu_type="cpu",
        gpu_count=1,
        weight_bytes=300_000,
        kv_bytes_per_token=1024,
        decode_batch_sizes=(1, 8),
        decode_step_s=(MEASURED.decode_step_s(1, 300), MEASURED.decode_step_s(8, 300)),
        prefill_tokens_per_s=MEASURED.prefill_tokens_per_s,
        output_tokens_mean=50,
        output_tokens_std=10,
        load_s=30.0,
        max_batch_size=8,
        min_kv_tokens=1024,
        gpu_memory_utilization=base.gpu_memory_utilization / 10,
        step_time=MEASURED,
    )


@pytest.fixture
def scenario_path(tmp_path: Path) -> Path:
    (tmp_path / "profiles").mkdir()
    save_profile(tiny_profile(), tmp_path / "profiles" / "tiny-a_cpu.yaml")
    path = tmp_path / "scenario.yaml"
    path.write_text(SCENARIO)
    return path


def test_the_fleet_uses_the_profile_file_and_the_new_gpu_type(scenario_path: Path) -> None:
    scenario = load_scenario(scenario_path)
    fleet = scenario.fleet()
    (instance,) = fleet.instances
    assert instance.gpu_type == "cpu"
    assert instance.gpu_memory_bytes == GIB
    profile = fleet.profile("tiny-a", instance)
    assert profile is not None
    assert profile == load_profile(scenario_path.parent / "profiles" / "tiny-a_cpu.yaml")
    assert profile.step_time == MEASURED
    assert scenario.gpu_cost_per_hour("cpu") == 0.1
    assert scenario.fleet_cost_per_hour() == pytest.approx(0.1)


def test_qlm_simulate_serves_with_the_measured_profile(scenario_path: Path) -> None:
    out = scenario_path.parent / "out"
    status = main(
        ["simulate", str(scenario_path), "--policy", "fcfs", "--out", str(out), "--no-progress"]
    )
    assert status == 0
    summary = json.loads((out / "summary.json").read_text())["policies"]["fcfs"]
    assert summary["requests"] == 40
    # 200-token prompts on an idle engine: one prefill iteration of the measured model
    one_prefill_s = MEASURED.iteration_s(200, 0, 200)
    assert summary["ttft_p50_s"] >= one_prefill_s
    assert summary["ttft_p50_s"] < 10 * one_prefill_s


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        (
            "profile_files: [profiles]",
            "profile_files: [nowhere]",
            "fleet.profile_files.0",
            "no such",
        ),
        (
            "{gpu_type: cpu, count: 1",
            "{gpu_type: tpu, count: 1",
            "fleet.instances.0.gpu_type",
            "tpu",
        ),
        ("memory_gib: 1,", "memory_gib: 0,", "fleet.gpu_types.cpu.memory_gib", "greater than 0"),
    ],
)
def test_bad_references_name_the_field(
    scenario_path: Path, old: str, new: str, field: str, message: str
) -> None:
    scenario_path.write_text(SCENARIO.replace(old, new))
    with pytest.raises(ConfigError) as info:
        load_scenario(scenario_path)
    assert field in str(info.value)
    assert message in str(info.value)


def test_a_broken_profile_file_is_reported_with_its_own_file_and_line(
    scenario_path: Path,
) -> None:
    profile_path = scenario_path.parent / "profiles" / "tiny-a_cpu.yaml"
    profile_path.write_text(profile_path.read_text().replace("load_s: 30.0", "load_s: -1"))
    with pytest.raises(ConfigError, match=r"tiny-a_cpu\.yaml:\d+: load_s"):
        load_scenario(scenario_path)
