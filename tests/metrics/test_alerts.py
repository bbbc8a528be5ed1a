"""The alert rules of the Helm chart: promtool's unit tests (qlm-alerts.test.yaml) pass, and every
metric and label the rules name is one QLM exports."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.metrics.tools import (
    ALERTS,
    binary,
    exported_names,
    grouping_labels,
    referenced_names,
)

RULE_TESTS = Path(__file__).parent / "qlm-alerts.test.yaml"
REQUIRED_ALERTS = {
    "QlmSloAttainmentBelowTarget",
    "QlmQueueGrowing",
    "QlmPlannerFailing",
    "QlmPlannerFallingBack",
}


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(ALERTS.read_text())
    assert set(data) == {"groups"}, "a rules file has only top-level `groups`"
    return [rule for group in data["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules_and_passes_their_unit_tests() -> None:
    promtool = binary("promtool")
    check = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run(
        [promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_every_alert_the_issue_asks_for_is_there_with_severity_and_summary() -> None:
    alerts = {r["alert"]: r for r in rules() if "alert" in r}
    assert set(alerts) >= REQUIRED_ALERTS
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"], name


def test_rules_name_only_exported_metrics_and_labels() -> None:
    exported = exported_names()
    expressions = [r["expr"] for r in rules()]
    used = referenced_names(expressions)
    assert used, "the rules reference qlm_ metrics"
    assert used <= set(exported), sorted(used - set(exported))
    known_labels = set().union(*exported.values())
    assert grouping_labels(expressions) <= known_labels
    assert not any("vllm:" in e for e in expressions)
