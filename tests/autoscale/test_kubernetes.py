"""The controller's StatefulSet scaling through the official Kubernetes client
(qlm/autoscale/kubernetes.py), against an HTTP server that answers the API's documented
request and response shapes for the scale subresource (GET and PATCH
/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}/scale, an autoscaling/v1 Scale).
No real API server can be installed on this machine from the package registries; the
server here checks what a real one would reject (path, verb, patch content type, body)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from qlm.autoscale.kubernetes import MERGE_PATCH, StatefulSetReplicas, in_cluster
from qlm.config import AutoscaleConfig, AutoscalePoolConfig

PATH = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/statefulsets/([^/]+)/scale$")
PATCH_TYPES = {MERGE_PATCH, "application/strategic-merge-patch+json"}


class FakeApi(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ScaleHandler)
        self.replicas: dict[tuple[str, str], int] = {("qlm", "qlm-pool-a10"): 2}
        self.patches: list[tuple[str, Any]] = []


class ScaleHandler(BaseHTTPRequestHandler):
    server: FakeApi

    def log_message(self, *args: object) -> None:
        pass

    def _target(self) -> tuple[str, str] | None:
        match = PATH.match(self.path.split("?")[0])
        key = (match.group(1), match.group(2)) if match else None
        if key is None or key not in self.server.replicas:
            self._send(404, {"kind": "Status", "status": "Failure", "reason": "NotFound"})
            return None
        return key

    def do_GET(self) -> None:
        if (key := self._target()) is not None:
            self._send(200, scale(key, self.server.replicas[key]))

    def do_PATCH(self) -> None:
        if (key := self._target()) is None:
            return
        content_type = self.headers.get("Content-Type", "")
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.patches.append((content_type, body))
        replicas = body.get("spec", {}).get("replicas")
        if content_type not in PATCH_TYPES or not isinstance(replicas, int) or replicas < 0:
            self._send(415 if content_type not in PATCH_TYPES else 422, {"kind": "Status"})
            return
        self.server.replicas[key] = replicas
        self._send(200, scale(key, replicas))

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def scale(key: tuple[str, str], replicas: int) -> dict[str, Any]:
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": key[1], "namespace": key[0], "resourceVersion": "7"},
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas, "selector": "app=qlm"},
    }


@pytest.fixture
def fake_api() -> Iterator[FakeApi]:
    server = FakeApi()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def apps_api(server: FakeApi) -> client.AppsV1Api:
    configuration = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    return client.AppsV1Api(client.ApiClient(configuration))


async def test_reads_and_merge_patches_the_scale_subresource(fake_api: FakeApi) -> None:
    replicas = StatefulSetReplicas(apps_api(fake_api), "qlm", {"a10": "qlm-pool-a10"})
    assert await replicas.replicas("a10") == 2
    await replicas.set_replicas("a10", 5)
    assert fake_api.replicas[("qlm", "qlm-pool-a10")] == 5
    assert fake_api.patches == [(MERGE_PATCH, {"spec": {"replicas": 5}})]
    assert await replicas.replicas("a10") == 5
    assert await replicas.replicas("unscaled") is None  # a pool without a StatefulSet


async def test_api_errors_reach_the_caller(fake_api: FakeApi) -> None:
    missing = StatefulSetReplicas(apps_api(fake_api), "qlm", {"a10": "no-such-set"})
    with pytest.raises(client.ApiException) as raised:
        await missing.set_replicas("a10", 1)
    assert raised.value.status == 404


def test_in_cluster_needs_statefulsets_and_a_namespace() -> None:
    unnamed = AutoscaleConfig(
        pools=(AutoscalePoolConfig(name="a10", instance_prefix="x", max_replicas=2),)
    )
    with pytest.raises(ValueError, match="autoscale pool a10 names no statefulset"):
        in_cluster(unnamed, "qlm")
    named = AutoscaleConfig(
        pools=(
            AutoscalePoolConfig(
                name="a10", instance_prefix="x", max_replicas=2, statefulset="qlm-pool-a10"
            ),
        )
    )
    with pytest.raises(ValueError, match=r"kubernetes_namespace"):
        in_cluster(named, None)  # not in a pod: no service-account namespace file


def test_fleet_file_scaling_errors_name_the_field() -> None:
    from prometheus_client import CollectorRegistry

    from qlm.config import ConfigError
    from qlm.config.serve_config import ServeConfig
    from qlm.serve.pool_scaling import pool_scaling

    base = {
        "models": [{"name": "mistral-7b", "max_context_tokens": 4096}],
        "fleet": {
            "instances": [{"id": "a", "gpu_type": "A100", "model": "mistral-7b", "count": 2}]
        },
    }
    off = ServeConfig.model_validate(base | {"controller": {"kubernetes_scaling": True}})
    with pytest.raises(ConfigError, match=r"qlm\.autoscale\.pools is empty"):
        pool_scaling(off, off.fleet(), CollectorRegistry())
    pools = {"pools": [{"name": "a", "instance_prefix": "a", "max_replicas": 3}]}
    too_big = ServeConfig.model_validate(base | {"qlm": {"autoscale": pools}})
    with pytest.raises(ConfigError, match="no instance a-2"):
        pool_scaling(too_big, too_big.fleet(), CollectorRegistry())
    fits = {"pools": [{"name": "a", "instance_prefix": "a", "max_replicas": 2}]}
    ok = ServeConfig.model_validate(base | {"qlm": {"autoscale": fits}})
    scaling = pool_scaling(ok, ok.fleet(), CollectorRegistry())
    assert scaling is not None
    assert [i.id for i in scaling.pools[0].instances] == ["a-0", "a-1"]
