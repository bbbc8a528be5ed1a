"""The rendered pods' commands run for real, outside Kubernetes: the bundled Redis container's
command line (env expanded from the rendered Secret as the kubelet does) starts a real
redis-server, the qlm containers' queue URL, built from the same Secret, opens qlm's own Redis
queue against it, and the API and controller containers' command lines start `qlm api` and
`qlm controller`, whose probe endpoints must answer on the ports the manifests name; an
autoscaled release's controller exports the gauge its pools' HPAs read.

Only what Kubernetes would provide is substituted: the Service host becomes 127.0.0.1, fixed
ports become free ones, /etc/qlm becomes a folder with the ConfigMap's files, /data a
temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from qlm.config import load_yaml_model
from qlm.config.serve_config import ServeConfig
from qlm.serve.runtime import open_queue
from tests.deploy.chart import (
    CI_VALUES,
    RELEASE,
    Helm,
    Manifest,
    container,
    container_argv,
    container_env,
    find,
    of_kind,
    workloads,
)
from tests.factories import make_request
from tests.redis_sentinel import SERVICE, SentinelGroup
from tests.redis_server import RedisServer, free_port, redis_server_binary, stop_process

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

QLM = str(Path(sys.executable).parent / "qlm")


def replace_option(argv: Sequence[str], option: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(option) + 1] = value
    return out


@dataclass
class BundledRedis:
    manifests: list[Manifest]
    port: int
    password: str


@pytest.fixture(scope="module")
def bundled_redis(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BundledRedis]:
    """redis-server started from the rendered Redis StatefulSet's container (two-pools values:
    the password is the one the chart generated into its Secret)."""
    binary = redis_server_binary()
    if binary is None:
        pytest.skip("redis-server is not installed")
    manifests = helm.template([CI_VALUES["two-pools"]])
    spec = container(find(manifests, "StatefulSet", f"{RELEASE}-qlm-redis"))
    env = container_env(manifests, spec)
    argv = container_argv(spec, env)
    assert argv[0] == "redis-server"
    port = free_port()
    data = tmp_path_factory.mktemp("redis-data")
    argv = replace_option(replace_option(argv, "--port", str(port)), "--dir", str(data))
    process = subprocess.Popen(
        [binary, *argv[1:], "--bind", "127.0.0.1", "--logfile", str(data / "redis.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port, password=env["REDIS_PASSWORD"], socket_timeout=1.0)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert process.poll() is None, "redis-server exited"
                assert time.monotonic() < deadline, "redis-server did not come up"
                time.sleep(0.05)
        client.close()
        yield BundledRedis(manifests, port, env["REDIS_PASSWORD"])
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_bundled_redis_requires_its_password_and_keeps_an_aof(bundled_redis: BundledRedis) -> None:
    assert len(bundled_redis.password) == 32
    assert bundled_redis.password.isalnum()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=bundled_redis.port, retry=Retry(NoBackoff(), 0)).ping()
    client = redis.Redis(port=bundled_redis.port, password=bundled_redis.password)
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    finally:
        client.close()


def local_queue_url(manifests: list[Manifest], url: str, port: int) -> str:
    """The URL a pod would use, pointed at the local server instead of the Redis Service."""
    parts = urlsplit(url)
    service = find(manifests, "Service", f"{RELEASE}-qlm-redis")
    assert parts.hostname == service["metadata"]["name"]
    assert parts.port == service["spec"]["ports"][0]["port"]
    return url.replace(parts.netloc.split("@")[-1], f"127.0.0.1:{port}")


def fleet_config(manifests: list[Manifest], key: str, folder: Path) -> ServeConfig:
    path = folder / key
    path.write_text(find(manifests, "ConfigMap", f"{RELEASE}-qlm-fleet")["data"][key])
    return load_yaml_model(path, ServeConfig)


async def test_every_qlm_pod_opens_the_queue_with_the_secret(
    bundled_redis: BundledRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = bundled_redis.manifests
    qlm_workloads = [w for w in workloads(manifests) if container(w)["command"] == ["qlm"]]
    assert len(qlm_workloads) == 4  # api, controller, pool a10, pool a100
    for workload in qlm_workloads:
        spec = container(workload)
        pod = f"{workload['metadata']['name']}-0"
        env = container_env(manifests, spec, {"metadata.name": pod})
        assert env["QLM_REDIS_PASSWORD"] == bundled_redis.password
        config_key = spec["args"][spec["args"].index("--config") + 1].rsplit("/", 1)[1]
        config = fleet_config(manifests, config_key, tmp_path)
        assert config.queue.url_env is not None
        url = local_queue_url(manifests, env[config.queue.url_env], bundled_redis.port)
        monkeypatch.setenv(config.queue.url_env, url)
        queue = open_queue(config)  # what `qlm api/controller/agent` do at start
        try:
            await queue.counts()
        finally:
            await queue.close()


async def test_external_redis_password_comes_from_the_named_secret(
    helm: Helm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    manifests = helm.template(
        [CI_VALUES["external-redis"]],
        {"redis.externalUrl": "redis://cache.example.internal:6379/3"},
    )
    assert not of_kind(manifests, "Secret")  # the password lives in the user's Secret
    with RedisServer(password="Ext3rnal-pass.word~") as server:
        api = container(find(manifests, "Deployment", f"{RELEASE}-qlm-api"))
        env = container_env(
            manifests, api, secrets={("managed-redis", "password"): "Ext3rnal-pass.word~"}
        )
        url = env["QLM_QUEUE_URL"]
        assert url == "redis://:Ext3rnal-pass.word~@cache.example.internal:6379/3"
        monkeypatch.setenv(
            "QLM_QUEUE_URL", url.replace("cache.example.internal:6379", f"127.0.0.1:{server.port}")
        )
        config = fleet_config(manifests, "fleet.yaml", tmp_path)
        assert config.queue.key_prefix == "qlm-prod"
        queue = open_queue(config)
        try:
            await queue.counts()
        finally:
            await queue.close()


async def test_sentinel_values_reach_the_primary_and_wait_for_a_replica(
    helm: Helm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis.sentinel and redis.replicasToAck render a queue that asks the Sentinels for the
    primary and whose writes a replica holds before they count."""
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    with SentinelGroup(replicas=1) as group:
        hosts = ",".join(f"127.0.0.1:{port}" for port in group.sentinel_ports)
        manifests = helm.template(
            [CI_VALUES["external-redis"]],
            {
                "redis.externalUrl": "",
                "redis.externalAuth.existingSecret": "",
                "redis.sentinel.hosts": "{" + hosts + "}",
                "redis.sentinel.service": SERVICE,
                "redis.replicasToAck": "1",
            },
        )
        api = container(find(manifests, "Deployment", f"{RELEASE}-qlm-api"))
        env = container_env(manifests, api)
        assert env["QLM_QUEUE_URL"] == group.url
        monkeypatch.setenv("QLM_QUEUE_URL", env["QLM_QUEUE_URL"])
        config = fleet_config(manifests, "fleet.yaml", tmp_path)
        assert config.queue.replicas_to_ack == 1
        queue = open_queue(config)
        try:
            await queue.enqueue(make_request(id="via-sentinel"))
            replica = redis.Redis.from_url(group.replicas[0].url, decode_responses=True)
            with replica:
                assert replica.exists(f"{config.queue.key_prefix}r:via-sentinel") == 1
        finally:
            await queue.close()


def start_pod_command(
    bundled_redis: BundledRedis,
    workload: Manifest,
    folder: Path,
    port_option: str,
) -> tuple[subprocess.Popen[bytes], int]:
    """Run a qlm container's command as Kubernetes would, on a free port; returns the process
    and the port its probes should answer on."""
    manifests = bundled_redis.manifests
    spec = container(workload)
    env = container_env(manifests, spec)
    env["QLM_QUEUE_URL"] = local_queue_url(manifests, env["QLM_QUEUE_URL"], bundled_redis.port)
    env.update(HOME=str(folder), XDG_CACHE_HOME=str(folder / "cache"), MPLCONFIGDIR=str(folder))
    config = find(manifests, "ConfigMap", f"{RELEASE}-qlm-fleet")["data"]
    for key, text in config.items():
        (folder / key).write_text(text)
    argv = container_argv(spec, env)
    argv[0] = QLM
    argv = replace_option(
        argv, "--config", str(folder / Path(argv[argv.index("--config") + 1]).name)
    )
    port = free_port()
    argv = replace_option(argv, port_option, str(port))
    log = (folder / "process.log").open("wb")
    process = subprocess.Popen(
        argv, env={"PATH": os.environ["PATH"], **env}, stdout=log, stderr=log
    )
    return process, port


def wait_for(url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the process exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"{url} did not answer 200 within {timeout_s} s:\n{log.read_text()}")


def probe_paths(spec: Mapping[str, object]) -> set[str]:
    paths = set()
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        http = spec[probe]["httpGet"]  # type: ignore[index]
        paths.add(http["path"])
    return paths


def stop(process: subprocess.Popen[bytes]) -> None:
    stop_process(process, grace_s=15)


@pytest.mark.slow
def test_api_container_command_serves_its_probes(
    bundled_redis: BundledRedis, tmp_path: Path
) -> None:
    api = find(bundled_redis.manifests, "Deployment", f"{RELEASE}-qlm-api")
    process, port = start_pod_command(bundled_redis, api, tmp_path, "--port")
    try:
        base = f"http://127.0.0.1:{port}"
        paths = probe_paths(container(api))
        assert paths == {"/healthz", "/readyz"}
        for path in sorted(paths):  # /readyz: 200 only when the password got Redis to answer
            wait_for(base + path, process, tmp_path / "process.log")
        models = httpx.get(f"{base}/v1/models", timeout=5).json()
        assert {m["id"] for m in models["data"]} == {"mistral-7b", "vicuna-13b"}
    finally:
        stop(process)


@pytest.mark.slow
def test_controller_container_command_serves_its_probes(
    bundled_redis: BundledRedis, tmp_path: Path
) -> None:
    controller = find(bundled_redis.manifests, "Deployment", f"{RELEASE}-qlm-controller")
    process, port = start_pod_command(bundled_redis, controller, tmp_path, "--metrics-port")
    try:
        assert probe_paths(container(controller)) == {"/metrics"}
        wait_for(f"http://127.0.0.1:{port}/metrics", process, tmp_path / "process.log")
        assert "qlm_" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        stop(process)


def exported(text: str, series: str) -> float | None:
    """The value of one series in a Prometheus text exposition, or None."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[1])
    return None


@pytest.mark.slow
def test_controller_publishes_the_gauge_each_pool_hpa_reads(
    helm: Helm, bundled_redis: BundledRedis, tmp_path: Path
) -> None:
    """The autoscale-hpa release's controller command, run for real, exports
    qlm_pool_desired_replicas with the pool label the pool's HPA selects."""
    manifests = helm.template(
        [CI_VALUES["autoscale-hpa"]], {"redis.auth.password": bundled_redis.password}
    )
    release = BundledRedis(manifests, bundled_redis.port, bundled_redis.password)
    controller = find(manifests, "Deployment", f"{RELEASE}-qlm-controller")
    process, port = start_pod_command(release, controller, tmp_path, "--metrics-port")
    metrics = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for(metrics, process, tmp_path / "process.log")
        hpas = [
            h
            for h in of_kind(manifests, "HorizontalPodAutoscaler")
            if "qlm.io/pool" in h["metadata"]["labels"]
        ]
        assert hpas
        deadline = time.monotonic() + 60  # the leader lease of an earlier test's controller
        for hpa in hpas:
            metric = hpa["spec"]["metrics"][0]["external"]["metric"]
            labels = ",".join(f'{k}="{v}"' for k, v in metric["selector"]["matchLabels"].items())
            series = f"{metric['name']}{{{labels}}}"
            while (value := exported(httpx.get(metrics, timeout=5).text, series)) is None:
                assert process.poll() is None, (tmp_path / "process.log").read_text()
                assert time.monotonic() < deadline, f"{series} never exported"
                time.sleep(0.2)
            assert hpa["spec"]["minReplicas"] <= value <= hpa["spec"]["maxReplicas"], series
    finally:
        stop(process)
