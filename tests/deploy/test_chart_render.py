"""The chart as Helm and Kubernetes see it: `helm lint --strict` and `helm template` for every CI
values file, every rendered object validated offline against the Kubernetes JSON schemas
(kubernetes-validate, strict: unknown fields fail) of the oldest and newest supported
Kubernetes, and what the objects must say: GPUs, placement, probes, labels, security."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.deploy.chart import (
    CHART,
    CI_VALUES,
    HELM_VERSION,
    RELEASE,
    Helm,
    Manifest,
    container,
    find,
    in_ci,
    of_kind,
    pod_spec,
    workloads,
)
from tests.deploy.crd_schemas import CRD_SCHEMAS

# Chart.yaml's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.27.0", "1.37.0")
VALUES_FILES = [pytest.param(None, id="defaults")] + [
    pytest.param(path, id=name) for name, path in CI_VALUES.items()
]


def test_ci_uses_the_pinned_helm(helm: Helm) -> None:
    if not in_ci():
        pytest.skip("the pin is enforced in CI; locally any helm 3 renders the chart")
    assert helm.version() == HELM_VERSION


@pytest.mark.parametrize("values", VALUES_FILES)
def test_helm_lint_strict_passes(helm: Helm, values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    result = helm.run(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def validate(manifest: Manifest, kube_version: str) -> None:
    """Kubernetes' own schema for built-in kinds; the CRD subset for prometheus-operator's."""
    crd = CRD_SCHEMAS.get((manifest["apiVersion"], manifest["kind"]))
    if crd is not None:
        jsonschema.validate(manifest, crd)
        return
    kubernetes_validate.validate(manifest, kube_version, strict=True)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", VALUES_FILES)
def test_every_rendered_object_matches_the_kubernetes_schema(
    helm: Helm, values: Path | None, kube_version: str
) -> None:
    manifests = helm.template([values] if values else [], kube_version=kube_version)
    assert manifests
    for manifest in manifests:
        try:
            validate(manifest, kube_version)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as error:
            where = ".".join(str(p) for p in error.path)
            pytest.fail(f"{manifest['kind']}/{manifest['metadata']['name']}: {where}: {error}")


def test_the_schema_check_rejects_a_misspelt_field(rendered: dict[str, list[Manifest]]) -> None:
    deployment = copy.deepcopy(find(rendered["two-pools"], "Deployment", f"{RELEASE}-qlm-api"))
    container(deployment)["livenessprobe"] = container(deployment).pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment, KUBE_VERSIONS[-1])
    monitor = copy.deepcopy(find(rendered["two-pools"], "ServiceMonitor", f"{RELEASE}-qlm"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor, KUBE_VERSIONS[-1])


def pool(manifests: list[Manifest], name: str) -> Manifest:
    return find(manifests, "StatefulSet", f"{RELEASE}-qlm-pool-{name}")


def test_each_pool_requests_its_own_gpus(rendered: dict[str, list[Manifest]]) -> None:
    two = rendered["two-pools"]
    for name, gpus, replicas in [("a10", 1, 4), ("a100", 2, 2)]:
        sts = pool(two, name)
        resources = container(sts, "agent")["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == gpus
        assert resources["limits"]["nvidia.com/gpu"] == gpus
        assert sts["spec"]["replicas"] == replicas
    assert container(pool(rendered["external-redis"], "h100"))["resources"]["limits"] == {
        "memory": "256Gi",
        "nvidia.com/gpu": 4,
    }


def test_each_pool_lands_on_its_own_nodes(rendered: dict[str, list[Manifest]]) -> None:
    a10, a100 = (pod_spec(pool(rendered["two-pools"], name)) for name in ("a10", "a100"))
    assert a10["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A10"}
    assert a100["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "cloud.example.com/pool": "a100",
    }
    gpu_taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert a10["tolerations"] == [gpu_taint]
    assert a100["tolerations"] == [
        gpu_taint,
        {"key": "dedicated", "operator": "Equal", "value": "a100", "effect": "NoSchedule"},
    ]


def test_pools_have_a_model_cache_and_shared_memory(rendered: dict[str, list[Manifest]]) -> None:
    a100 = pool(rendered["two-pools"], "a100")
    mounts = {m["name"]: m for m in container(a100)["volumeMounts"]}
    assert mounts["model-cache"]["mountPath"] == "/models"
    claim = a100["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "model-cache"
    assert claim["spec"]["resources"]["requests"]["storage"] == "400Gi"  # the pool's override
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    volumes = {v["name"]: v for v in pod_spec(a100)["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    h100 = pool(rendered["external-redis"], "h100")
    volumes = {v["name"]: v for v in pod_spec(h100)["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {
        "claimName": "llm-weights",
        "readOnly": True,
    }
    assert "volumeClaimTemplates" not in h100["spec"]


def test_every_container_has_probes_on_its_own_ports(rendered: dict[str, list[Manifest]]) -> None:
    for name, manifests in rendered.items():
        for workload in workloads(manifests):
            for spec in pod_spec(workload)["containers"]:
                where = f"{name}: {workload['metadata']['name']}/{spec['name']}"
                ports = {p["name"] for p in spec.get("ports", [])}
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    assert probe in spec, f"{where} has no {probe}"
                    http = spec[probe].get("httpGet")
                    if http is not None:
                        assert http["port"] in ports, f"{where}: {probe} port {http['port']}"


def test_api_probes_are_healthz_and_readyz(rendered: dict[str, list[Manifest]]) -> None:
    api = container(find(rendered["two-pools"], "Deployment", f"{RELEASE}-qlm-api"))
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"  # fails while Redis is down


STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "helm.sh/chart",
)


def test_every_object_and_pod_carries_the_standard_labels(
    rendered: dict[str, list[Manifest]],
) -> None:
    for name, manifests in rendered.items():
        for manifest in manifests:
            labels = manifest["metadata"]["labels"]
            where = f"{name}: {manifest['kind']}/{manifest['metadata']['name']}"
            assert set(STANDARD_LABELS) <= set(labels), where
            assert labels["app.kubernetes.io/instance"] == RELEASE
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
        for workload in workloads(manifests):
            template_labels = workload["spec"]["template"]["metadata"]["labels"]
            selector = workload["spec"]["selector"]["matchLabels"]
            assert set(STANDARD_LABELS) <= set(template_labels)
            assert selector.items() <= template_labels.items()


def test_selectors_of_different_workloads_never_overlap(
    rendered: dict[str, list[Manifest]],
) -> None:
    """A Deployment or StatefulSet adopting another's pods would be a silent disaster."""
    for manifests in rendered.values():
        found = workloads(manifests)
        for a in found:
            for b in found:
                if a is b:
                    continue
                b_labels = b["spec"]["template"]["metadata"]["labels"]
                assert not a["spec"]["selector"]["matchLabels"].items() <= b_labels.items()


def test_every_pod_runs_as_non_root_with_no_privileges(
    rendered: dict[str, list[Manifest]],
) -> None:
    for name, manifests in rendered.items():
        for workload in workloads(manifests):
            spec = pod_spec(workload)
            where = f"{name}: {workload['metadata']['name']}"
            assert spec["securityContext"]["runAsNonRoot"] is True, where
            assert spec["securityContext"]["runAsUser"] > 0, where
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for each in spec["containers"]:
                context = each["securityContext"]
                assert context["runAsNonRoot"] is True, where
                assert context["allowPrivilegeEscalation"] is False, where
                assert context["readOnlyRootFilesystem"] is True, where
                assert context["capabilities"]["drop"] == ["ALL"], where
            # A read-only root needs a writable /tmp (HOME, vLLM logs, caches).
            assert any(
                m["mountPath"] == "/tmp" for c in spec["containers"] for m in c["volumeMounts"]
            )


def test_api_is_autoscaled_with_disruption_budgets(rendered: dict[str, list[Manifest]]) -> None:
    two = rendered["two-pools"]
    api = find(two, "Deployment", f"{RELEASE}-qlm-api")
    assert "replicas" not in api["spec"]  # the HPA owns it
    hpa = find(two, "HorizontalPodAutoscaler", f"{RELEASE}-qlm-api")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": f"{RELEASE}-qlm-api",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    for component in ("api", "controller"):
        pdb = find(two, "PodDisruptionBudget", f"{RELEASE}-qlm-{component}")
        deployment = find(two, "Deployment", f"{RELEASE}-qlm-{component}")
        assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
        assert pdb["spec"]["maxUnavailable"] == 1
    fixed = rendered["external-redis"]
    assert find(fixed, "Deployment", f"{RELEASE}-qlm-api")["spec"]["replicas"] == 3
    assert not of_kind(fixed, "HorizontalPodAutoscaler")


def test_controller_runs_two_replicas(rendered: dict[str, list[Manifest]]) -> None:
    for manifests in rendered.values():
        controller = find(manifests, "Deployment", f"{RELEASE}-qlm-controller")
        assert controller["spec"]["replicas"] == 2
        assert container(controller)["args"][0] == "controller"


def services_by_port_name(manifests: list[Manifest]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for service in of_kind(manifests, "Service"):
        if service["metadata"]["labels"].get("qlm.io/metrics") == "true":
            ports = {p["name"] for p in service["spec"]["ports"]}
            found[service["metadata"]["name"]] = ports
    return found


def test_service_monitor_scrapes_api_controller_and_every_pool(
    rendered: dict[str, list[Manifest]],
) -> None:
    two = rendered["two-pools"]
    monitor = find(two, "ServiceMonitor", f"{RELEASE}-qlm")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped = {
        s["metadata"]["name"]
        for s in of_kind(two, "Service")
        if selector.items() <= s["metadata"]["labels"].items()
    }
    assert scraped == {
        f"{RELEASE}-qlm-api",
        f"{RELEASE}-qlm-controller-metrics",
        f"{RELEASE}-qlm-pool-a10",
        f"{RELEASE}-qlm-pool-a100",
    }
    endpoint_ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    for service, ports in services_by_port_name(two).items():
        assert len(ports & endpoint_ports) == 1, f"{service} would be scraped {ports}"
    # Metric Services point at the container ports the processes listen on.
    controller = container(find(two, "Deployment", f"{RELEASE}-qlm-controller"))
    assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in controller["ports"]
    assert not of_kind(rendered["one-pool"], "ServiceMonitor")


def test_prometheus_rule_carries_the_alert_file_unchanged(
    rendered: dict[str, list[Manifest]],
) -> None:
    import yaml

    rule = find(rendered["two-pools"], "PrometheusRule", f"{RELEASE}-qlm")
    alerts = yaml.safe_load((CHART / "files" / "qlm-alerts.yaml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]
    assert not of_kind(rendered["external-redis"], "PrometheusRule")


def test_grafana_dashboard_configmap_holds_the_dashboard_json(
    rendered: dict[str, list[Manifest]],
) -> None:
    import json

    dashboard = find(rendered["two-pools"], "ConfigMap", f"{RELEASE}-qlm-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "files" / "qlm-dashboard.json").read_text())
    assert json.loads(dashboard["data"]["qlm-dashboard.json"]) == shipped
    elsewhere = find(rendered["external-redis"], "ConfigMap", f"{RELEASE}-qlm-dashboard")
    assert elsewhere["metadata"]["namespace"] == "monitoring"


def rules_of(role: Manifest) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def test_rbac_only_when_asked_and_only_for_the_controller(
    rendered: dict[str, list[Manifest]],
) -> None:
    plain = rendered["two-pools"]
    assert not of_kind(plain, "Role")
    assert not of_kind(plain, "ClusterRole")
    for workload in workloads(plain):
        assert pod_spec(workload)["automountServiceAccountToken"] is False
    scaled = rendered["external-redis"]
    assert not of_kind(scaled, "ClusterRole")
    role = find(scaled, "Role", f"{RELEASE}-qlm-controller")
    verbs = {(r["apiGroups"][0], r["resources"][0]): set(r["verbs"]) for r in rules_of(role)}
    assert verbs[("", "pods")] == {"get", "list", "watch"}
    assert verbs[("apps", "statefulsets")] == {"get", "list", "watch"}
    scale = next(r for r in rules_of(role) if r["resources"] == ["statefulsets/scale"])
    assert scale["resourceNames"] == [f"{RELEASE}-qlm-pool-h100"]
    binding = find(scaled, "RoleBinding", f"{RELEASE}-qlm-controller")
    controller = find(scaled, "Deployment", f"{RELEASE}-qlm-controller")
    assert binding["subjects"][0]["name"] == pod_spec(controller)["serviceAccountName"]
    assert pod_spec(controller)["automountServiceAccountToken"] is True
    api = find(scaled, "Deployment", f"{RELEASE}-qlm-api")
    assert pod_spec(api)["serviceAccountName"] != pod_spec(controller)["serviceAccountName"]


def test_pods_roll_when_the_fleet_file_changes(helm: Helm) -> None:
    def checksum(time_limit: str) -> str:
        manifests = helm.template([CI_VALUES["one-pool"]], {"qlm.planner.time_limit_s": time_limit})
        sts = pool(manifests, "a10")
        value: str = sts["spec"]["template"]["metadata"]["annotations"]["checksum/fleet"]
        return value

    assert checksum("0.8") == checksum("0.8")
    assert checksum("0.8") != checksum("0.5")
