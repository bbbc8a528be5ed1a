"""The parts as Kubernetes runs them: `qlm api`, `qlm controller` and `qlm agent` as separate
processes on one Redis queue, each exporting its own metrics (the API on its port, the others
on --metrics-port). A real Prometheus scrapes all three; the dashboard, pointed at it, shows the
fleet-wide view no single process has."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.metrics.plane import run_requests, sample_sums, serve_fleet
from tests.metrics.tools import PrometheusServer, binary
from tests.redis_server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(240)]


def started(tmp_path: Path, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    qlm = Path(sys.executable).parent / "qlm"
    log = (tmp_path / f"{name}.log").open("wb")
    return subprocess.Popen([str(qlm), *args], stdout=log, stderr=subprocess.STDOUT)


def wait_up(urls: list[str], processes: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    deadline = time.monotonic() + 120
    pending = list(urls)
    while pending and time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            break
        with contextlib.suppress(httpx.HTTPError):
            pending = [u for u in pending if httpx.get(u, timeout=1).status_code != 200]
        time.sleep(0.2)
    if pending:
        logs = "\n".join(p.read_text()[-1500:] for p in tmp_path.glob("*.log"))
        raise RuntimeError(f"not up: {pending}\n{logs}")


@pytest.fixture
def ports() -> dict[str, int]:
    return {"api": free_port(), "controller": free_port(), "agent": free_port()}


@pytest.fixture
def prometheus(ports: dict[str, int]) -> Iterator[PrometheusServer]:
    binary("prometheus")
    targets = [f"127.0.0.1:{p}" for p in ports.values()]
    # Prometheus cuts a scrape at its interval: 0.5 s failed every scrape of a busy agent in CI.
    with PrometheusServer(targets, scrape_interval_s=2.0) as server:
        yield server


def scraped_all(view: dict[str, Any]) -> bool:
    """The dashboard shows what the API, the agent and the controller each exported."""
    interactive = view["requests"].get("interactive", {})
    return bool(
        view["attainment"].get("interactive", {}).get("evaluated", 0) >= 4
        and interactive.get("admitted", 0) >= 4
        and interactive.get("completed", 0) >= 4
        and view["planner"]["runs"].get("heuristic", 0) >= 1
        and bool(view["misses_by_cause"].get("interactive"))
    )


def test_prometheus_aggregates_api_controller_and_agent_processes(
    tmp_path: Path, redis_url: str, ports: dict[str, int], prometheus: PrometheusServer
) -> None:
    cfg = serve_fleet(ports["api"])
    cfg["queue"] = {"url": redis_url}
    cfg["metrics"] = {"sample_every_s": 0.5, "prometheus_url": prometheus.url}
    config = tmp_path / "fleet.yaml"
    config.write_text(yaml.safe_dump(cfg))
    common = ["--config", str(config)]
    instances = ["--instance", "gpu-0", "--instance", "gpu-1"]
    args = {
        "api": ["api", *common],
        "controller": ["controller", *common, "--metrics-port", str(ports["controller"])],
        "agent": ["agent", *common, *instances, "--metrics-port", str(ports["agent"])],
    }
    processes = [started(tmp_path, name, a) for name, a in args.items()]
    api = f"http://127.0.0.1:{ports['api']}"
    own = {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}
    try:
        wait_up([f"{api}/readyz", own["controller"], own["agent"]], processes, tmp_path)
        run_requests(api, n_ok=3, n_late=1)
        texts = {name: httpx.get(url).text for name, url in own.items()}
        # Each process knows its part only.
        admitted = sample_sums(texts["api"], "qlm_requests_total", "outcome")["admitted"]
        assert admitted == 4
        assert sample_sums(texts["api"], "qlm_slo_evaluated_total", "slo_class") == {}
        evaluated = sample_sums(texts["agent"], "qlm_slo_evaluated_total", "slo_class")
        assert evaluated["interactive"] == 4
        # The late one (1 ms TTFT) missed: the agent records why. Which share of its wait was
        # longest (the control loop's planning or the engine's prefill) depends on the load of
        # the machine, so the cause is one of the two; the dashboard must show the same one.
        missed = sample_sums(texts["agent"], "qlm_slo_missed_total", "cause")
        agent_causes = {c: int(n) for c, n in missed.items() if n}
        assert agent_causes in ({"queued": 1}, {"in_engine": 1})
        assert sample_sums(texts["api"], "qlm_slo_missed_total", "cause") == {}
        assert sample_sums(texts["controller"], "qlm_controller_leading", "")[""] == 1
        assert sample_sums(texts["agent"], "qlm_requests_total", "outcome")["admitted"] == 0

        # Prometheus scrapes each process on its own schedule: wait for all three parts.
        deadline = time.monotonic() + 90
        view = httpx.get(f"{api}/dashboard/data").json()
        while not scraped_all(view) and time.monotonic() < deadline:
            time.sleep(0.5)
            view = httpx.get(f"{api}/dashboard/data").json()
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
    assert view["source"] == "prometheus"
    assert view["attainment"]["interactive"]["met"] == 3
    assert view["attainment"]["interactive"]["evaluated"] == 4
    assert view["requests"]["interactive"]["admitted"] == 4  # from the API process
    assert view["requests"]["interactive"]["completed"] == 4  # from the agent process
    assert view["planner"]["runs"]["heuristic"] >= 1  # from the controller process
    assert view["misses_by_cause"]["interactive"] == agent_causes  # from the agent process
    assert [(i["instance_id"], i["state"]) for i in view["instances"]] == [
        ("gpu-0", "ready"),
        ("gpu-1", "ready"),
    ]
