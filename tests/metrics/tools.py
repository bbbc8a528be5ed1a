"""Helpers for the metric tests: the external binaries (promtool, prometheus, chromium,
chromedriver; installed by scripts/install_prometheus.sh and scripts/install_chromium.sh),
a throwaway Prometheus server, and the names QLM exports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from qlm.clock import VirtualClock
from qlm.metrics import PlaneMetrics
from tests.redis_server import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy/helm/qlm/files/qlm-alerts.yaml"
GRAFANA = ROOT / "deploy/helm/qlm/files/qlm-dashboard.json"
METRIC_NAME = re.compile(r"(?<![\w:])qlm_[a-z0-9_]+")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
}


def binary(name: str) -> str:
    """The binary's path; a missing one skips the test here and fails it in CI (where the
    Makefile installs it)."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (make metrics-tools browser-tools)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def exported_names() -> dict[str, set[str]]:
    """Every sample name QLM can export -> the label names its series carry."""
    registry = CollectorRegistry()
    PlaneMetrics(registry, VirtualClock(), slo_classes=("c",), models=("m",))
    names: dict[str, set[str]] = {}
    for family in registry.collect():
        labels = set(_label_names(registry, family.name))
        for suffix in SUFFIXES[family.type]:
            extra = {"le"} if suffix == "_bucket" else set()
            names[family.name + suffix] = labels | extra
    return names


def _label_names(registry: CollectorRegistry, family: str) -> tuple[str, ...]:
    collector = registry._names_to_collectors[family]  # the one place labels are listed
    return tuple(getattr(collector, "_labelnames", ()))


def referenced_names(expressions: Iterable[str]) -> set[str]:
    return {m for expr in expressions for m in METRIC_NAME.findall(expr)}


def grouping_labels(expressions: Iterable[str]) -> set[str]:
    """Label names in `by (...)`, `without (...)`, `on (...)` clauses and `{label="..."}`
    matchers."""
    labels: set[str] = set()
    for expr in expressions:
        for clause in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
            labels |= {x.strip() for x in clause.split(",") if x.strip()}
        for matchers in re.findall(r"\{([^}]*)\}", expr):
            labels |= set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    return labels


class PrometheusServer:
    """A `prometheus` process with its own config and data directory on a free port, scraping
    `targets` every `scrape_interval_s`; never a system service."""

    def __init__(
        self,
        targets: Sequence[str],
        *,
        scrape_interval_s: float = 1.0,
        rule_files: Sequence[Path] = (),
        start_timeout_s: float = 30.0,
    ) -> None:
        self.targets = list(targets)
        self.scrape_interval_s = scrape_interval_s
        self.rule_files = list(rule_files)
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config(self) -> dict[str, Any]:
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": "qlm",
                    "metrics_path": "/metrics",
                    "static_configs": [{"targets": self.targets}],
                }
            ],
        }

    def start(self) -> PrometheusServer:
        self.dir = Path(tempfile.mkdtemp(prefix="qlm-prometheus-"))
        config = self.dir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self._config()))
        self.port = free_port()
        log = (self.dir / "prometheus.log").open("wb")
        self._process = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        log = self.log()
        self.stop()
        raise RuntimeError(f"prometheus did not become ready:\n{log[-2000:]}")

    def log(self) -> str:
        if self.dir is None:
            return ""
        path = self.dir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self._process is not None:
            stop_process(self._process, grace_s=10)
        self._process = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
