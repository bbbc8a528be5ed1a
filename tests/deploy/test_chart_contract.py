"""The chart against the code it deploys: the fleet files it renders are accepted by
ServeConfig, the command lines by `qlm`'s own argument parser, the instance ids match the pods
that will run the agents, every model a pool lists is servable on its GPUs by QLM's profiles,
and values.schema.json offers exactly the fields the code's settings classes accept."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from qlm.config import load_yaml_model
from qlm.config.agent_settings import AgentConfig
from qlm.config.api_settings import ApiConfig
from qlm.config.metrics_settings import MetricsConfig
from qlm.config.serve_config import ControllerConfig, LiveEngineConfig, ServeConfig
from qlm.config.vllm_config import VllmEngineConfig
from qlm.serve import serve_cli as serve_cli
from qlm.types import DEFAULT_GPU_TYPES
from tests.deploy.chart import (
    CHART,
    CI_VALUES,
    RELEASE,
    Helm,
    Manifest,
    container,
    container_argv,
    expand,
    find,
    fleet_files,
    of_kind,
    workloads,
)

CONFIG_DIR = "/etc/qlm"


def serve_parser() -> argparse.ArgumentParser:
    """The parser `qlm` builds for its live-plane subcommands (qlm/cli.py adds the same)."""
    parser = argparse.ArgumentParser(prog="qlm")
    serve_cli.add_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def write_fleet_files(manifests: list[Manifest], folder: Path) -> dict[str, Path]:
    config = find(manifests, "ConfigMap", f"{RELEASE}-qlm-fleet")
    paths = {}
    for key, text in config["data"].items():
        paths[key] = folder / key
        paths[key].write_text(text)
    return paths


@pytest.mark.parametrize("name", list(CI_VALUES))
def test_fleet_files_load_with_the_code(
    rendered: dict[str, list[Manifest]], name: str, tmp_path: Path
) -> None:
    manifests = rendered[name]
    for key, path in write_fleet_files(manifests, tmp_path).items():
        config = load_yaml_model(path, ServeConfig)  # raises ConfigError naming file and line
        fleet = config.fleet()
        assert config.queue.url is None, key  # the URL (with the password) comes from env
        assert config.queue.url_env == "QLM_QUEUE_URL", key
        assert config.api.host == "0.0.0.0"
        vllm = VllmEngineConfig.model_validate(config.engine.vllm)
        assert set(vllm.models) <= {m.name for m in config.models}
        for instance in fleet.instances:
            assert instance.loaded_model is not None
            assert fleet.can_serve(instance, instance.loaded_model), (key, instance)
        if key != "fleet.yaml":  # a pool's file: its instances can run every model it lists
            prefix = f"{RELEASE}-qlm-pool-{key.removeprefix('fleet-').removesuffix('.yaml')}-"
            mine = [i for i in fleet.instances if i.id.startswith(prefix)]
            assert mine, key
            for instance in mine:
                for model in vllm.models:
                    assert fleet.can_serve(instance, model), (key, instance.id, model)


@pytest.mark.parametrize("name", list(CI_VALUES))
def test_pools_list_every_model_the_planner_may_place_on_them(
    rendered: dict[str, list[Manifest]], name: str, tmp_path: Path
) -> None:
    """The planner may swap an instance to any fleet model with a profile for its GPU type; the
    agent's vLLM launcher knows only its pool's models, so the examples must list them all."""
    for key, path in write_fleet_files(rendered[name], tmp_path).items():
        if key == "fleet.yaml":
            continue
        config = load_yaml_model(path, ServeConfig)
        fleet = config.fleet()
        prefix = f"{RELEASE}-qlm-pool-{key.removeprefix('fleet-').removesuffix('.yaml')}-"
        instance = next(i for i in fleet.instances if i.id.startswith(prefix))
        placeable = {m.name for m in config.models if fleet.can_serve(instance, m.name)}
        assert placeable == set(VllmEngineConfig.model_validate(config.engine.vllm).models), key


def pool_statefulsets(manifests: list[Manifest]) -> list[Manifest]:
    return [
        s for s in of_kind(manifests, "StatefulSet") if "qlm.io/pool" in s["metadata"]["labels"]
    ]


def pool_size(sts: Manifest, fleet_file: dict[str, Any]) -> int:
    """Pods the StatefulSet may have: its replicas, or its autoscaled pool's max_replicas."""
    if "replicas" in sts["spec"]:
        return int(sts["spec"]["replicas"])
    autoscaled = fleet_file["qlm"]["autoscale"]["pools"]
    name = sts["metadata"]["name"]
    return int(next(p["max_replicas"] for p in autoscaled if p["instance_prefix"] == name))


@pytest.mark.parametrize("name", list(CI_VALUES))
def test_agents_find_their_instance_and_only_their_pools_models(
    rendered: dict[str, list[Manifest]], name: str
) -> None:
    manifests = rendered[name]
    files = fleet_files(manifests)
    everyone = {i["id"]: i for i in files["fleet.yaml"]["fleet"]["instances"]}
    pod_names = set()
    for sts in pool_statefulsets(manifests):
        pool_name = sts["metadata"]["labels"]["qlm.io/pool"]
        pool_file = files[f"fleet-{pool_name}.yaml"]
        assert pool_file["fleet"]["instances"] == files["fleet.yaml"]["fleet"]["instances"]
        gpus = container(sts)["resources"]["limits"]["nvidia.com/gpu"]
        for ordinal in range(pool_size(sts, files["fleet.yaml"])):
            pod = f"{sts['metadata']['name']}-{ordinal}"  # StatefulSet pod naming
            pod_names.add(pod)
            instance = everyone[pod]
            assert instance["gpu_type"] == sts["metadata"]["labels"]["qlm.io/gpu-type"]
            assert instance["gpu_count"] == gpus
            assert instance["model"] in pool_file["engine"]["vllm"]["models"]
    assert pod_names == set(everyone)  # no instance without a pod, no pod without one


def test_two_pool_engines_load_each_pools_models_from_the_cache(
    rendered: dict[str, list[Manifest]],
) -> None:
    files = fleet_files(rendered["two-pools"])
    assert files["fleet-a10.yaml"]["engine"]["vllm"]["models"] == {
        "mistral-7b": "/models/mistral-7b"
    }
    a100 = files["fleet-a100.yaml"]["engine"]["vllm"]
    assert a100["models"] == {
        "mistral-7b": "/models/mistral-7b",
        "vicuna-13b": "lmsys/vicuna-13b-v1.5",  # a repo id, resolved in HF_HOME offline
    }
    assert a100["extra_args"] == ["--tensor-parallel-size", "2"]
    assert files["fleet-a10.yaml"]["engine"]["vllm"]["extra_args"] == []
    assert a100["kv_cache_gib"] is None  # vLLM sizes the KV cache on a GPU
    external = fleet_files(rendered["external-redis"])["fleet-h100.yaml"]["engine"]["vllm"]
    assert external["models"]["llama-70b"] == "/weights/llama-70b"  # absolute: as given


@pytest.mark.parametrize("name", list(CI_VALUES))
def test_every_command_line_parses_with_qlms_own_parser(
    rendered: dict[str, list[Manifest]], name: str
) -> None:
    manifests = rendered[name]
    files = fleet_files(manifests)
    instances = {i["id"] for i in files["fleet.yaml"]["fleet"]["instances"]}
    parser = serve_parser()
    seen = set()
    for workload in workloads(manifests):
        spec = container(workload)
        if spec["command"] != ["qlm"]:
            continue  # redis
        pod = f"{workload['metadata']['name']}-0"
        argv = [expand(a, {"POD_NAME": pod}) for a in spec["args"]]
        args = parser.parse_args(argv)  # SystemExit on an unknown flag
        seen.add(args.command)
        assert str(args.config).startswith(CONFIG_DIR + "/")
        assert Path(args.config).name in files
        if args.command == "agent":
            assert args.instance == [pod]
            assert pod in instances
        ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
        if args.command == "api":
            assert args.port == ports["http"]
        else:
            assert args.metrics_port == ports["metrics"]
    assert seen == {"api", "controller", "agent"}


def test_container_argv_expands_the_pod_name(rendered: dict[str, list[Manifest]]) -> None:
    sts = pool_statefulsets(rendered["one-pool"])[0]
    argv = container_argv(container(sts), {"POD_NAME": "demo-qlm-pool-a10-1"})
    assert argv[:2] == ["qlm", "agent"]
    assert argv[argv.index("--instance") + 1] == "demo-qlm-pool-a10-1"


def schema_properties(*path: str) -> set[str]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    node: dict[str, Any] = schema
    for key in path:
        if key.startswith("#"):
            node = schema["definitions"][key[1:]]
        else:
            node = node["properties"][key]
            if "$ref" in node:
                node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return set(node["properties"])


# values.schema.json section -> (settings class, fields the chart sets itself)
PASSTHROUGH: dict[tuple[str, ...], tuple[type[BaseModel], set[str]]] = {
    ("api", "settings"): (ApiConfig, {"host", "port"}),
    ("controller", "settings"): (ControllerConfig, {"node_id", "kubernetes_scaling"}),
    ("agent", "settings"): (AgentConfig, set()),
    ("engine",): (LiveEngineConfig, set()),
    ("#vllm",): (VllmEngineConfig, {"models"}),
    ("metrics", "settings"): (MetricsConfig, {"host", "port"}),
}


@pytest.mark.parametrize("section", list(PASSTHROUGH), ids=".".join)
def test_schema_offers_exactly_the_fields_the_code_accepts(section: tuple[str, ...]) -> None:
    model, chart_owned = PASSTHROUGH[section]
    offered = schema_properties(*section)
    accepted = set(model.model_fields) - chart_owned
    assert offered - accepted == set(), f"the code rejects {sorted(offered - accepted)}"
    assert accepted - offered == set(), f"values.schema.json lacks {sorted(accepted - offered)}"


def test_chart_knows_the_codes_builtin_gpu_types(helm: Helm) -> None:
    error = helm.template_error([CI_VALUES["one-pool"]], {"pools[0].gpuType": "TPU"})
    listed = error.split('gpuType "TPU" is unknown; known: ')[1].split(" (add")[0]
    assert listed.split(", ") == sorted(DEFAULT_GPU_TYPES)


def test_a_fine_tune_is_planned_with_its_base_models_profiles(helm: Helm, tmp_path: Path) -> None:
    """fleet.modelCopies reaches the fleet file's model_copies: the planner prices the
    fine-tune like its base on the pool's GPUs, and the pool's agents may load it."""
    extra = tmp_path / "fine-tune.yaml"
    extra.write_text(
        yaml.safe_dump(
            {
                "models": [
                    {"name": "mistral-7b", "maxContextTokens": 8192, "path": "mistral-7b"},
                    {"name": "support-bot", "maxContextTokens": 8192, "path": "support-bot"},
                ],
                "fleet": {"modelCopies": {"support-bot": "mistral-7b"}},
            }
        )
    )
    values = [CI_VALUES["one-pool"], extra]
    manifests = helm.template(values, {"pools[0].models": "{mistral-7b,support-bot}"})
    files = write_fleet_files(manifests, tmp_path)
    config = load_yaml_model(files["fleet.yaml"], ServeConfig)
    fleet = config.fleet()
    base = fleet.profiles[("mistral-7b", "A10")]
    assert fleet.profiles[("support-bot", "A10")] == replace(base, model="support-bot")
    assert all(fleet.can_serve(i, "support-bot") for i in fleet.instances)
    refused = helm.template_error(values, {"fleet.modelCopies.support-bot": "3"})
    assert "modelCopies" in refused  # the schema takes a base model's name
