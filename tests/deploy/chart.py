"""Helpers for the Helm chart tests: find the pinned helm binary, render the chart, and read the
rendered objects the way Kubernetes would (secret references, $(VAR) expansion in env and
args).

helm is looked up as $HELM, then .tools/bin/helm (scripts/install_chart_tools.sh, run by
`make chart-tools`), then on PATH. Without one the tests skip, except in CI (CI=true), where a
missing helm is a failure: the chart must be tested there.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "qlm"
CI_VALUES = {
    "one-pool": CHART / "ci" / "one-pool-values.yaml",
    "two-pools": CHART / "ci" / "two-pools-values.yaml",
    "external-redis": CHART / "ci" / "external-redis-values.yaml",
    "autoscale-hpa": CHART / "ci" / "autoscale-hpa-values.yaml",
    "autoscale-controller": CHART / "ci" / "autoscale-controller-values.yaml",
}
RELEASE = "demo"
NAMESPACE = "qlm-test"
HELM_VERSION = "v3.17.3"  # scripts/install_chart_tools.sh pins this one

Manifest = dict[str, Any]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"true", "1", "yes"}


def helm_binary() -> str | None:
    if os.environ.get("HELM"):
        named = os.environ["HELM"]
        if shutil.which(named) is None:
            pytest.fail(f"HELM={named} is not an executable")
        return named
    pinned = ROOT / ".tools" / "bin" / "helm"
    if pinned.exists():
        return str(pinned)
    return shutil.which("helm")


def require_helm() -> str:
    binary = helm_binary()
    if binary is not None:
        return binary
    if in_ci():
        pytest.fail("helm is missing in CI: `make chart-tools` installs the pinned one")
    pytest.skip("helm is not installed; `make chart-tools` installs the pinned one in .tools/bin")


class RenderError(Exception):
    """helm exited non-zero; the message is its stderr."""


@dataclass(frozen=True)
class Helm:
    binary: str

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HELM_CACHE_HOME": "/tmp/qlm-helm-cache"},
        )
        if check and result.returncode != 0:
            raise RenderError(result.stderr)
        return result

    def version(self) -> str:
        return self.run("version", "--template", "{{.Version}}").stdout.strip()

    def template(
        self,
        values: Sequence[Path] = (),
        sets: Mapping[str, str] | None = None,
        kube_version: str = "1.30.0",
    ) -> list[Manifest]:
        """Render the chart with `helm template` and parse every object."""
        args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
        args += ["--kube-version", kube_version]
        for path in values:
            args += ["-f", str(path)]
        for key, value in (sets or {}).items():
            args += ["--set", f"{key}={value}"]
        return [doc for doc in yaml.safe_load_all(self.run(*args).stdout) if doc]

    def template_error(
        self, values: Sequence[Path] = (), sets: Mapping[str, str] | None = None
    ) -> str:
        """Render expecting a failure; return helm's stderr."""
        try:
            self.template(values, sets)
        except RenderError as error:
            return str(error)
        raise AssertionError("helm template succeeded but was expected to fail")


def find(manifests: Iterable[Manifest], kind: str, name: str) -> Manifest:
    for item in manifests:
        if item["kind"] == kind and item["metadata"]["name"] == name:
            return item
    known = sorted(f"{m['kind']}/{m['metadata']['name']}" for m in manifests)
    raise KeyError(f"no {kind}/{name}; rendered: {known}")


def of_kind(manifests: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def workloads(manifests: Iterable[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] in {"Deployment", "StatefulSet"}]


def pod_spec(workload: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Manifest, name: str | None = None) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod_spec(workload)["containers"]
    if name is None:
        assert len(containers) == 1, [c["name"] for c in containers]
        return containers[0]
    return next(c for c in containers if c["name"] == name)


def fleet_files(manifests: Iterable[Manifest]) -> dict[str, dict[str, Any]]:
    """The fleet files of the fleet ConfigMap, parsed, by key (fleet.yaml, fleet-POOL.yaml)."""
    config = find(manifests, "ConfigMap", f"{RELEASE}-qlm-fleet")
    return {key: yaml.safe_load(text) for key, text in config["data"].items()}


_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)|\$\$")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in env values, command and args: a defined variable is
    replaced, an undefined reference stays as written, $$ is a literal $."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, text)


def secret_value(manifests: Iterable[Manifest], name: str, key: str) -> str:
    secret = find(manifests, "Secret", name)
    if "stringData" in secret and key in secret["stringData"]:
        return str(secret["stringData"][key])
    return base64.b64decode(secret["data"][key]).decode()


def container_env(
    manifests: Sequence[Manifest],
    spec: Mapping[str, Any],
    field_refs: Mapping[str, str] | None = None,
    secrets: Mapping[tuple[str, str], str] | None = None,
) -> dict[str, str]:
    """The environment the kubelet would give the container: values expanded in order,
    secretKeyRef read from the rendered Secrets (or `secrets` for ones made outside the
    chart), fieldRef from `field_refs` (fieldPath -> value)."""
    env: dict[str, str] = {}
    for var in spec.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(str(var["value"]), env)
            continue
        source = var["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            outside = (secrets or {}).get((ref["name"], ref["key"]))
            env[var["name"]] = (
                outside if outside is not None else secret_value(manifests, ref["name"], ref["key"])
            )
        elif "fieldRef" in source:
            env[var["name"]] = (field_refs or {})[source["fieldRef"]["fieldPath"]]
        else:
            raise AssertionError(f"unexpected env source {source}")
    return env


def container_argv(spec: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    return [expand(str(arg), env) for arg in [*spec.get("command", []), *spec.get("args", [])]]
