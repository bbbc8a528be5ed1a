"""Values that are missing or contradict each other stop `helm template` (non-zero exit) with a
message that names the key to fix (templates/_validations.tpl); shapes and types are caught by
values.schema.json before the templates run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart import CI_VALUES, RELEASE, Helm

ONE_POOL = yaml.safe_load(CI_VALUES["one-pool"].read_text())


def pools(**changes: Any) -> dict[str, Any]:
    return {"pools": [{**ONE_POOL["pools"][0], **changes}]}


CASES: dict[str, tuple[dict[str, Any], str]] = {
    "redis-both": (
        {"redis": {"enabled": True, "externalUrl": "redis://cache:6379/0"}},
        "redis.enabled and redis.externalUrl are both set",
    ),
    "redis-neither": (
        {"redis": {"enabled": False, "externalUrl": ""}},
        "no Redis: set redis.enabled=true for the bundled Redis, or redis.enabled=false with "
        "redis.externalUrl",
    ),
    "redis-url-with-password": (
        {"redis": {"enabled": False, "externalUrl": "redis://:hunter2@cache:6379/0"}},
        "redis.externalUrl must not carry credentials: put the password in a Secret",
    ),
    "redis-bundled-and-sentinel": (
        {"redis": {"sentinel": {"hosts": ["s0:26379"]}}},
        "redis.enabled and redis.sentinel.hosts are both set",
    ),
    "redis-url-and-sentinel": (
        {
            "redis": {
                "enabled": False,
                "externalUrl": "redis://c:6379/0",
                "sentinel": {"hosts": ["s0"]},
            }
        },
        "redis.externalUrl and redis.sentinel.hosts are both set",
    ),
    "redis-bundled-waits-for-a-replica": (
        {"redis": {"replicasToAck": 1}},
        "redis.replicasToAck > 0 with the bundled Redis, which has no replica",
    ),
    "redis-sentinel-password-without-secret": (
        {"redis": {"enabled": False, "sentinel": {"hosts": ["s0"], "passwordKey": "sp"}}},
        "redis.sentinel.passwordKey names a key of redis.externalAuth.existingSecret",
    ),
    "redis-url-scheme": (
        {"redis": {"enabled": False, "externalUrl": "http://cache:6379"}},
        'redis.externalUrl "http://cache:6379": the scheme must be redis:// or rediss://',
    ),
    "redis-password-twice": (
        {"redis": {"auth": {"existingSecret": "mine", "password": "abc"}}},
        "redis.auth.password and redis.auth.existingSecret are both set",
    ),
    "redis-external-auth-while-bundled": (
        {"redis": {"auth": {"existingSecret": ""}, "externalAuth": {"existingSecret": "x"}}},
        "redis.externalAuth.existingSecret is set but Redis is bundled",
    ),
    "redis-password-not-url-safe": (
        {"redis": {"auth": {"existingSecret": "", "password": "p@ss/word"}}},
        "redis.auth.password may only contain letters, digits",
    ),
    "no-models": (
        {"models": []},
        "models is empty: list every model the fleet serves",
    ),
    "no-pools": (
        {"pools": []},
        "pools is empty: add at least one engine pool",
    ),
    "pool-without-models": (
        pools(models=[]),
        "pools[0] (a10): models is empty; list the models this pool may serve",
    ),
    "model-in-no-pool": (
        {
            "models": [
                *ONE_POOL["models"],
                {"name": "vicuna-13b", "maxContextTokens": 4096, "path": "vicuna"},
            ]
        },
        "models[1] (vicuna-13b) is in no pool: add it to the models of a pool",
    ),
    "pool-model-unknown": (
        pools(models=["mistral-7b", "llama-3"]),
        'pools[0] (a10): model "llama-3" is not in models (known: mistral-7b)',
    ),
    "gpu-count-zero": (
        pools(gpusPerInstance=0),
        "pools[0] (a10): gpusPerInstance must be at least 1 (got 0)",
    ),
    "replicas-zero": (
        pools(replicas=0),
        "pools[0] (a10): replicas must be at least 1 (got 0)",
    ),
    "unknown-gpu-type": (
        pools(gpuType="L4"),
        'pools[0] (a10): gpuType "L4" is unknown; known: A10, A100, H100 (add others under '
        "fleet.gpuMemoryGiB)",
    ),
    "initial-model-elsewhere": (
        pools(initialModel="vicuna-13b"),
        'pools[0] (a10): initialModel "vicuna-13b" is not one of the pool\'s models',
    ),
    "gpu-resources-by-hand": (
        pools(resources={"limits": {"nvidia.com/gpu": 2}}),
        "pools[0] (a10): resources must not set nvidia.com/gpu; the chart sets it from "
        "gpusPerInstance",
    ),
    "model-without-weights": (
        {"models": [{"name": "mistral-7b", "maxContextTokens": 8192}]},
        "models[0] (mistral-7b): neither path nor repo is set",
    ),
    "existing-claim-unnamed": (
        {"modelCache": {"type": "existingClaim", "existingClaim": ""}},
        "pools[0] (a10): modelCache.type is existingClaim but modelCache.existingClaim",
    ),
    "autoscaling-inverted": (
        {"api": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}},
        "api.autoscaling.maxReplicas (2) is below minReplicas (5)",
    ),
    "rbac-without-service-account": (
        {"rbac": {"create": True}, "serviceAccount": {"create": False}},
        "rbac.create needs serviceAccount.create",
    ),
    "pool-autoscaling-via-controller-without-rbac": (
        pools(autoscaling={"enabled": True, "via": "controller"}),
        "pools[0] (a10): autoscaling.via controller needs rbac.create=true and "
        "rbac.allowScaling=true: the QLM controller sets the StatefulSet's scale",
    ),
    "pool-autoscaling-via-controller-without-scaling": (
        {**pools(autoscaling={"enabled": True, "via": "controller"}), "rbac": {"create": True}},
        "pools[0] (a10): autoscaling.via controller needs rbac.create=true and "
        "rbac.allowScaling=true",
    ),
    "pool-autoscaling-inverted": (
        pools(autoscaling={"enabled": True, "minReplicas": 5, "maxReplicas": 2}),
        "pools[0] (a10): autoscaling.minReplicas (5) is above maxReplicas (2)",
    ),
    "pool-autoscaling-max-zero": (
        pools(autoscaling={"enabled": True, "minReplicas": 0, "maxReplicas": 0}),
        "pools[0] (a10): autoscaling.maxReplicas must be at least 1 (got 0)",
    ),
    "pool-autoscaling-hpa-to-zero": (
        pools(autoscaling={"enabled": True, "minReplicas": 0, "via": "hpa"}),
        "pools[0] (a10): autoscaling.minReplicas must be at least 1 with via hpa (got 0)",
    ),
    "pool-autoscaling-modes-mixed": (
        {
            "pools": [
                {**ONE_POOL["pools"][0], "autoscaling": {"enabled": True, "via": "controller"}},
                {**ONE_POOL["pools"][0], "name": "b", "autoscaling": {"enabled": True}},
            ],
            "rbac": {"create": True, "allowScaling": True},
        },
        "pools: autoscaling.via is hpa for b but controller for a10; use one mode for every "
        "autoscaled pool",
    ),
    "autoscale-pools-by-hand": (
        {"qlm": {"autoscale": {"pools": [{"name": "a10", "max_replicas": 2}]}}},
        "qlm.autoscale.pools is set by the chart from pools[].autoscaling",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_invalid_values_fail_with_a_message_naming_the_key(
    helm: Helm, tmp_path: Path, case: str
) -> None:
    override, message = CASES[case]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(override))
    result = helm.run(
        "template", RELEASE, str(CI_VALUES["one-pool"].parent.parent),
        "-f", str(CI_VALUES["one-pool"]), "-f", str(values), check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "qlm: the values are not valid:" in result.stderr
    assert message in result.stderr, result.stderr


def test_every_problem_is_reported_at_once(helm: Helm, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({**pools(gpusPerInstance=0, replicas=0), "models": []}))
    error = helm.template_error([CI_VALUES["one-pool"], values])
    assert "gpusPerInstance must be at least 1" in error
    assert "replicas must be at least 1" in error
    assert "models is empty" in error


def test_schema_rejects_a_misspelt_key_before_templating(helm: Helm) -> None:
    error = helm.template_error([CI_VALUES["one-pool"]], {"pools[0].gpuCount": "2"})
    assert "pools.0: Additional property gpuCount is not allowed" in error
    error = helm.template_error([CI_VALUES["one-pool"]], {"engine.vllm.dtype": "fp8"})
    assert "engine.vllm.dtype" in error


def test_autoscaled_pool_needs_no_replicas(helm: Helm) -> None:
    """An autoscaled pool's size is its scaler's: replicas may be left out (or be 0)."""
    manifests = helm.template(
        [CI_VALUES["one-pool"]], {"pools[0].replicas": "0", "pools[0].autoscaling.enabled": "true"}
    )
    assert manifests
    error = helm.template_error([CI_VALUES["one-pool"]], {"pools[0].replicas": "0"})
    assert "pools[0] (a10): replicas must be at least 1 (got 0)" in error


def test_schema_rejects_an_unknown_scaler_and_the_templates_do_without_it(helm: Helm) -> None:
    sets = {"pools[0].autoscaling.enabled": "true", "pools[0].autoscaling.via": "keda"}
    error = helm.template_error([CI_VALUES["one-pool"]], sets)
    assert "pools.0.autoscaling.via" in error
    args = ["template", RELEASE, str(CI_VALUES["one-pool"].parent.parent)]
    args += ["-f", str(CI_VALUES["one-pool"]), "--skip-schema-validation"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    result = helm.run(*args, check=False)
    if "unknown flag: --skip-schema-validation" in result.stderr:
        pytest.skip("this helm predates --skip-schema-validation (3.16); the pinned one has it")
    assert result.returncode != 0
    assert 'pools[0] (a10): autoscaling.via "keda" is unknown; use hpa' in result.stderr
