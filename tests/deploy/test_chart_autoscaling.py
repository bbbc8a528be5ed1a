"""Pool autoscaling in the chart (pools[].autoscaling): via hpa, a HorizontalPodAutoscaler per
pool follows the controller's qlm_pool_desired_replicas gauge; via controller, the controller
sets the StatefulSet's scale itself. Either way the fleet file lists maxReplicas instances and
the pool in qlm.autoscale.pools, and the StatefulSet leaves replicas to the scaler. The
rendered fleet files are loaded by the code that sizes and scales the pools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.config
import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry

from qlm.autoscale import kubernetes as kubernetes_scale
from qlm.autoscale.need import pools_of
from qlm.config import load_yaml_model
from qlm.config.serve_config import ServeConfig
from qlm.serve.pool_scaling import pool_scaling
from tests.deploy.chart import (
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    Helm,
    Manifest,
    find,
    fleet_files,
    of_kind,
    pod_spec,
)

A10 = f"{RELEASE}-qlm-pool-a10"
A100 = f"{RELEASE}-qlm-pool-a100"


def pool_hpas(manifests: list[Manifest]) -> dict[str, Manifest]:
    """The pools' HorizontalPodAutoscalers (the API's has no pool label), by pool name."""
    return {
        hpa["metadata"]["labels"]["qlm.io/pool"]: hpa
        for hpa in of_kind(manifests, "HorizontalPodAutoscaler")
        if "qlm.io/pool" in hpa["metadata"]["labels"]
    }


def instance_ids(fleet_file: dict[str, Any], prefix: str) -> list[str]:
    return [i["id"] for i in fleet_file["fleet"]["instances"] if i["id"].startswith(prefix + "-")]


def test_hpa_scales_the_pool_statefulset_to_the_desired_replicas_gauge(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["autoscale-hpa"]
    hpas = pool_hpas(manifests)
    assert set(hpas) == {"a10"}  # the a100 pool does not autoscale
    hpa = hpas["a10"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["metadata"]["name"] == A10
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": A10,
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 6)
    # AverageValue 1 over an External metric: desired replicas = ceil(metric / 1).
    assert hpa["spec"]["metrics"] == [
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": "qlm_pool_desired_replicas",
                    "selector": {"matchLabels": {"pool": "a10"}},
                },
                "target": {"type": "AverageValue", "averageValue": "1"},
            },
        }
    ]
    # The controller's stabilization is the hysteresis: the HPA follows the gauge down at once;
    # the values' scale-up policy is passed through.
    assert hpa["spec"]["behavior"] == {
        "scaleDown": {"stabilizationWindowSeconds": 0},
        "scaleUp": {"policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
    }
    sts = find(manifests, "StatefulSet", A10)
    assert "replicas" not in sts["spec"]  # the HPA owns it; an upgrade must not reset it
    assert find(manifests, "StatefulSet", A100)["spec"]["replicas"] == 2


def test_hpa_behavior_values_override_the_chart_default(helm: Helm) -> None:
    manifests = helm.template(
        [CI_VALUES["autoscale-hpa"]],
        {"pools[0].autoscaling.behavior.scaleDown.stabilizationWindowSeconds": "120"},
    )
    behavior = pool_hpas(manifests)["a10"]["spec"]["behavior"]
    assert behavior["scaleDown"] == {"stabilizationWindowSeconds": 120}


def test_controller_mode_renders_no_pool_hpa_and_lets_the_controller_scale(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["autoscale-controller"]
    assert pool_hpas(manifests) == {}
    for name in (A10, A100):
        assert "replicas" not in find(manifests, "StatefulSet", name)["spec"]
    role = find(manifests, "Role", f"{RELEASE}-qlm-controller")
    scale = next(r for r in role["rules"] if r["resources"] == ["statefulsets/scale"])
    assert scale["apiGroups"] == ["apps"]
    assert {"get", "patch"} <= set(scale["verbs"])
    assert set(scale["resourceNames"]) == {A10, A100}
    controller = find(manifests, "Deployment", f"{RELEASE}-qlm-controller")
    binding = find(manifests, "RoleBinding", f"{RELEASE}-qlm-controller")
    assert binding["subjects"][0]["name"] == pod_spec(controller)["serviceAccountName"]
    assert pod_spec(controller)["automountServiceAccountToken"] is True  # in-cluster config


EXPECTED_POOLS = {
    "autoscale-hpa": [
        {"name": "a10", "instance_prefix": A10, "min_replicas": 1, "max_replicas": 6},
    ],
    "autoscale-controller": [
        {
            "name": "a10",
            "instance_prefix": A10,
            "min_replicas": 1,
            "max_replicas": 8,
            "statefulset": A10,
        },
        {
            "name": "a100",
            "instance_prefix": A100,
            "min_replicas": 0,
            "max_replicas": 3,
            "statefulset": A100,
        },
    ],
}
EXPECTED_INSTANCES = {
    "autoscale-hpa": {A10: 6, A100: 2},
    "autoscale-controller": {A10: 8, A100: 3},
}
GIVEN_AUTOSCALE: dict[str, dict[str, Any]] = {
    "autoscale-hpa": {"target_utilization": 0.7, "scale_down_stabilization_s": 600},
    "autoscale-controller": {"window_s": 600, "drain_timeout_s": 900},
}


@pytest.mark.parametrize("name", list(EXPECTED_POOLS))
def test_fleet_file_lists_max_replicas_instances_and_the_autoscaled_pools(
    rendered: dict[str, list[Manifest]], name: str
) -> None:
    files = fleet_files(rendered[name])
    assert set(files) == {"fleet.yaml", "fleet-a10.yaml", "fleet-a100.yaml"}
    for key, fleet_file in files.items():  # the API's, the controller's and the agents'
        for prefix, count in EXPECTED_INSTANCES[name].items():
            assert instance_ids(fleet_file, prefix) == [f"{prefix}-{k}" for k in range(count)]
        autoscale = fleet_file["qlm"]["autoscale"]
        assert autoscale == {**GIVEN_AUTOSCALE[name], "pools": EXPECTED_POOLS[name]}, key
        controller = fleet_file["controller"]
        if name == "autoscale-controller":
            assert controller["kubernetes_scaling"] is True, key
        else:
            assert "kubernetes_scaling" not in controller, key


def write_fleet_file(manifests: list[Manifest], folder: Path) -> Path:
    """The controller's fleet file as the ConfigMap holds it."""
    path = folder / "fleet.yaml"
    path.write_text(find(manifests, "ConfigMap", f"{RELEASE}-qlm-fleet")["data"]["fleet.yaml"])
    return path


def test_hpa_fleet_file_sizes_its_pools_and_only_publishes(
    rendered: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    config = load_yaml_model(write_fleet_file(rendered["autoscale-hpa"], tmp_path), ServeConfig)
    scaling = pool_scaling(config, config.fleet(), CollectorRegistry())
    assert scaling is not None
    assert scaling.setter is None  # the HPA applies the published replicas
    (a10,) = scaling.pools
    assert a10.name == "a10"
    assert [i.id for i in a10.instances] == [f"{A10}-{k}" for k in range(6)]
    assert a10.min_replicas == 1


class RecordingAppsApi:
    """The two AppsV1Api calls StatefulSetReplicas makes, recorded with the RBAC verb each
    needs (GET: get, PATCH: patch) on statefulsets/scale."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str]] = []  # (verb, namespace, name)

    def read_namespaced_stateful_set_scale(self, name: str, namespace: str) -> Any:
        self.requests.append(("get", namespace, name))
        return client.V1Scale(spec=client.V1ScaleSpec(replicas=1))

    def patch_namespaced_stateful_set_scale(
        self, name: str, namespace: str, body: Any, **_: Any
    ) -> None:
        self.requests.append(("patch", namespace, name))


async def test_controller_fleet_file_scales_the_rendered_statefulsets_within_its_role(
    rendered: dict[str, list[Manifest]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = rendered["autoscale-controller"]
    config = load_yaml_model(write_fleet_file(manifests, tmp_path), ServeConfig)
    assert config.controller.kubernetes_scaling
    pools = pools_of(config.qlm.autoscale, config.fleet(), {})
    assert [(p.name, len(p.instances), p.min_replicas) for p in pools] == [
        ("a10", 8, 1),
        ("a100", 3, 0),
    ]
    # No cluster here: the client is built, the credentials are not read.
    monkeypatch.setattr(kubernetes.config, "load_incluster_config", lambda: None)
    setter = kubernetes_scale.in_cluster(config.qlm.autoscale, NAMESPACE)
    statefulsets = {s["metadata"]["name"] for s in of_kind(manifests, "StatefulSet")}
    assert set(setter.statefulsets.values()) <= statefulsets
    api = RecordingAppsApi()
    setter.api = api
    for pool in ("a10", "a100"):
        await setter.replicas(pool)
        await setter.set_replicas(pool, 2)
    role = find(manifests, "Role", f"{RELEASE}-qlm-controller")
    allowed = {
        (verb, name)
        for rule in role["rules"]
        if rule["apiGroups"] == ["apps"] and rule["resources"] == ["statefulsets/scale"]
        for verb in rule["verbs"]
        for name in rule["resourceNames"]
    }
    assert api.requests
    for verb, namespace, name in api.requests:
        assert namespace == NAMESPACE  # the release's, where the Role is
        assert (verb, name) in allowed, (verb, name)


def without_generated_password(manifests: list[Manifest]) -> list[Manifest]:
    """The objects with the Redis Secret's data left out (a new password at every render)."""
    return [
        {k: v for k, v in m.items() if not (m["kind"] == "Secret" and k == "data")}
        for m in manifests
    ]


def test_pools_without_autoscaling_render_exactly_as_before(
    helm: Helm, rendered: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    """autoscaling.enabled false, whatever its other keys say, changes nothing."""
    values = yaml.safe_load(CI_VALUES["two-pools"].read_text())
    for pool in values["pools"]:
        pool["autoscaling"] = {"enabled": False, "minReplicas": 3, "maxReplicas": 9, "via": "hpa"}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    assert without_generated_password(helm.template([path])) == without_generated_password(
        rendered["two-pools"]
    )
    fixed = rendered["two-pools"]
    assert pool_hpas(fixed) == {}
    assert find(fixed, "StatefulSet", A10)["spec"]["replicas"] == 4
    fleet_file = fleet_files(fixed)["fleet.yaml"]
    assert "autoscale" not in fleet_file["qlm"]
    assert "kubernetes_scaling" not in fleet_file["controller"]
