"""The fleet section shared by snapshots, fleet files and scenarios: instance ids, GPU counts,
GPU types, profile precedence, sizes and costs, and old field names refused with a pointer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from qlm.config import ConfigError, load_yaml_model
from qlm.config.fleet_config import FleetConfig
from qlm.config.profile_files import ProfileFile, profile_named, save_profile
from qlm.config.serve_config import ServeConfig
from qlm.perf.profile import GIB
from qlm.sim.scenario import Scenario
from qlm.snapshot import Snapshot

TINY: dict[str, Any] = {
    "model": "tiny",
    "gpu_type": "cpu",
    "weight_bytes": 1 << 20,
    "kv_bytes_per_token": 1024,
    "decode_table": {"batch_sizes": [1, 4], "step_s": [0.01, 0.02]},
    "prefill_tokens_per_s": 1000,
    "output_tokens_mean": 10,
    "output_tokens_std": 1,
    "load_s": 1,
}


def fleet(**fields: Any) -> FleetConfig:
    return FleetConfig.model_validate(fields)


def test_instance_ids_gpu_counts_and_memory() -> None:
    config = fleet(
        instances=[
            {"id": "solo", "gpu_type": "A100", "model": "mistral-7b"},
            {"id": "pool", "gpu_type": "A10", "count": 2, "model": "mistral-7b"},
            {"gpu_type": "A100", "model": "llama-70b"},
            {"gpu_type": "H100", "count": 0},
        ]
    )
    built = config.fleet(["mistral-7b", "llama-70b"])
    ids = [i.id for i in built.instances]
    assert ids == ["solo", "pool-0", "pool-1", "a100-llama-70b-0"]
    big = built.instance("a100-llama-70b-0")
    assert big.gpu_count == profile_named("llama-70b", "A100").gpu_count  # the profile's
    assert built.instance("solo").gpu_count == 1
    assert built.instance("pool-0").gpu_memory_bytes == 24 * GIB
    assert config.counts() == {"A100": 2, "A10": 2, "H100": 0}


@pytest.mark.parametrize(
    ("fields", "loc", "message"),
    [
        (
            {"instances": [{"gpu_type": "B200"}]},
            ("instances", 0, "gpu_type"),
            "unknown gpu_type 'B200'",
        ),
        (
            {"instances": [{"gpu_type": "cpu"}], "gpu_types": {"cpu": {"cost_per_hour": 1}}},
            ("gpu_types", "cpu", "memory_gib"),
            "required for a type that is not built in",
        ),
        (
            {"instances": [{"id": "a", "gpu_type": "A10"}, {"id": "a", "gpu_type": "A100"}]},
            ("instances", 1, "id"),
            "instance id 'a' is used twice",
        ),
        (
            {"instances": [{"gpu_type": "A10", "model": "vicuna-13b"}]},
            ("instances", 0, "model"),
            "vicuna-13b cannot run on 1 x A10",
        ),
        (
            {"instances": [{"gpu_type": "A10", "loaded_model": "mistral-7b"}]},
            ("instances", 0, "loaded_model"),
            "no longer read: renamed to model",
        ),
        (
            {"instances": [{"gpu_type": "A10"}], "gpu_cost_per_hour": {"A10": 1}},
            ("gpu_cost_per_hour",),
            "no longer read: set gpu_types",
        ),
        (
            {"instances": [{"gpu_type": "A10"}], "profiles": [{**TINY, "weight_gb": 1}]},
            ("profiles", 0, "weight_gb"),
            "the inline format is the profile file format",
        ),
        (
            {"instances": [{"gpu_type": "A10"}], "model_copies": {"a": "b", "b": "mistral-7b"}},
            ("model_copies", "a"),
            "its base 'b' is itself a copy",
        ),
        (
            {"instances": [{"gpu_type": "A10", "model": "ft"}], "model_copies": {"ft": "x"}},
            ("model_copies", "ft"),
            "its base 'x' has no profile on A10",  # a misspelt base, named at the copy
        ),
        (
            {"instances": [{"gpu_type": "A10", "count": 100_001}]},
            ("instances", 0, "count"),
            "less than or equal to 100000",
        ),
    ],
)
def test_errors_name_the_field(fields: dict[str, Any], loc: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        fleet(**fields)
    errors = {tuple(e["loc"]): e["msg"] for e in info.value.errors()}
    assert loc in errors, errors
    assert message in errors[loc]


def test_gpu_types_add_types_and_replace_prices() -> None:
    config = fleet(
        instances=[{"gpu_type": "cpu", "model": "tiny"}, {"gpu_type": "A100"}],
        gpu_types={"cpu": {"memory_gib": 1}, "A100": {"cost_per_hour": 2.5}},
        profiles=[TINY],
    )
    assert config.memory_bytes("cpu") == GIB
    assert config.memory_bytes("A100") == 80 * GIB  # built in, only the price replaced
    assert (config.cost_per_hour("cpu"), config.cost_per_hour("A100")) == (0.0, 2.5)
    assert config.cost_per_hour("A10") == 1.0
    cheaper = config.with_gpu_costs({"cpu": 0.1})
    assert (cheaper.cost_per_hour("cpu"), cheaper.memory_bytes("cpu")) == (0.1, GIB)


def test_profiles_inline_then_files_then_packaged(tmp_path: Path) -> None:
    packaged = profile_named("mistral-7b", "A100")
    save_profile(replace(packaged, load_s=11.0), tmp_path / "a.yaml")
    inline = ProfileFile.of(packaged).model_dump(mode="json", exclude_none=True)
    files = fleet(instances=[{"gpu_type": "A100"}], profile_files=[tmp_path / "a.yaml"])
    assert files.profiles_for(["mistral-7b"])[("mistral-7b", "A100")].load_s == 11.0
    both = files.model_copy(update={"profiles": (ProfileFile.model_validate(inline),)})
    assert both.profiles_for(["mistral-7b"])[("mistral-7b", "A100")].load_s == packaged.load_s
    none = fleet(instances=[{"gpu_type": "A100"}], packaged_profiles=False)
    assert none.profiles_for(["mistral-7b"]) == {}
    assert fleet(instances=[{"gpu_type": "A100"}]).profiles_for(["mistral-7b"]) == {
        ("mistral-7b", "A100"): packaged
    }


def test_a_copy_takes_its_base_profiles_under_its_own_name_unless_it_has_one() -> None:
    config = fleet(
        instances=[{"gpu_type": "A100", "model": "ft-1"}, {"gpu_type": "A10"}],
        model_copies={"ft-1": "mistral-7b", "ft-2": "vicuna-13b"},
        profiles=[{**TINY, "model": "ft-2", "gpu_type": "A100"}],
    )
    profiles = config.profiles_for(["ft-1", "ft-2", "mistral-7b"])
    for gpu in ("A100", "A10"):
        assert profiles[("ft-1", gpu)] == replace(profile_named("mistral-7b", gpu), model="ft-1")
    assert profiles[("ft-2", "A100")].weight_bytes == TINY["weight_bytes"]  # its own wins
    assert ("ft-2", "A10") not in profiles  # vicuna-13b has no A10 profile to copy
    assert profiles[("mistral-7b", "A100")] == profile_named("mistral-7b", "A100")
    built = config.fleet(["ft-1"])
    assert built.instance("a100-ft-1-0").loaded_model == "ft-1"


def test_with_counts_shares_a_type_among_its_groups() -> None:
    config = fleet(
        instances=[
            {"gpu_type": "A100", "count": 3, "model": "mistral-7b"},
            {"gpu_type": "A100", "count": 1, "model": "vicuna-13b"},
        ]
    )
    assert [g.count for g in config.with_counts({"A100": 8}).instances] == [6, 2]
    with pytest.raises(ValueError, match="not in the fleet"):
        config.with_counts({"H100": 1})


SECTION = """\
fleet:
  instances:
    - {id: a, gpu_type: A10, count: 2, model: mistral-7b}
    - {id: b, gpu_type: A100, count: 1, model: mistral-7b}
"""
FILES = {
    ServeConfig: "models: [{name: mistral-7b}]\n",
    Snapshot: "requests: [{model: mistral-7b, slo_class: interactive, count: 1}]\n",
    Scenario: "name: s\nworkload:\n  - {name: w, arrivals: {process: backlog}, count: 1,\n"
    "     models: {mistral-7b: 1}, classes: {interactive: 1},\n"
    "     lengths: {source: fixed, prompt_tokens: 10, output_tokens: 10}}\n",
}


@pytest.mark.parametrize("model", [ServeConfig, Snapshot, Scenario], ids=lambda m: m.__name__)
def test_every_file_reads_the_same_section_the_same_way(tmp_path: Path, model: type[Any]) -> None:
    path = tmp_path / "file.yaml"
    path.write_text(SECTION + FILES[model])
    built = load_yaml_model(path, model).fleet()
    assert [(i.id, i.gpu_type, i.loaded_model) for i in built.instances] == [
        ("a-0", "A10", "mistral-7b"),
        ("a-1", "A10", "mistral-7b"),
        ("b", "A100", "mistral-7b"),
    ]
    path.write_text(SECTION.replace("gpu_type: A100", "gpu_type: V100") + FILES[model])
    with pytest.raises(ConfigError, match=r"file.yaml:4: fleet.instances.1.gpu_type: unknown"):
        load_yaml_model(path, model)
