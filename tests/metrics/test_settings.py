"""The fleet file's `metrics:` section and the `--metrics-port` flag."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from qlm.config import ConfigError, load_yaml_model
from qlm.config.serve_config import ServeConfig
from qlm.serve.serve_cli import _load, add_commands

FLEET = {
    "models": [{"name": "mistral-7b"}],
    "fleet": {"instances": [{"id": "i", "gpu_type": "A100", "model": "mistral-7b"}]},
}


def write(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({**FLEET, **extra}))
    return path


def test_attainment_targets_must_name_configured_classes(tmp_path: Path) -> None:
    ok = load_yaml_model(
        write(tmp_path, metrics={"attainment_targets": {"batch-2": 0.9}}), ServeConfig
    )
    assert ok.metrics.attainment_target("batch-2") == 0.9
    assert ok.metrics.attainment_target("interactive") == 0.99
    with pytest.raises(ConfigError, match=r"'batch-3' is not an SLO class"):
        load_yaml_model(
            write(tmp_path, metrics={"attainment_targets": {"batch-3": 0.9}}), ServeConfig
        )
    with pytest.raises(ConfigError, match=r"fleet.yaml:\d+: metrics.attainment_targets.batch-2"):
        load_yaml_model(
            write(tmp_path, metrics={"attainment_targets": {"batch-2": 1.5}}), ServeConfig
        )


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser()
    add_commands(root.add_subparsers())
    return root


def test_metrics_port_flag_only_for_processes_without_the_api(tmp_path: Path) -> None:
    path = str(write(tmp_path))
    args = parser().parse_args(["controller", "--config", path, "--metrics-port", "9555"])
    assert _load(args).metrics.port == 9555
    agent = parser().parse_args(["agent", "--config", path, "--instance", "i"])
    assert _load(agent).metrics.port == 9400
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--config", path, "--metrics-port", "9555"])
    with pytest.raises(SystemExit):
        parser().parse_args(
            ["agent", "--config", path, "--instance", "i", "--metrics-port", "70000"]
        )
