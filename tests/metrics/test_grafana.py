"""The Grafana dashboard the chart ships: every panel queries metrics and labels QLM exports, every
expression parses as PromQL (promtool checks them as recording rules), and it has the panels of
the /dashboard page."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.metrics.tools import GRAFANA, binary, exported_names, grouping_labels, referenced_names

# What Grafana substitutes before sending a query, and a value of the same kind.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$slo_class": ".*"}
PAGE_PANELS = (  # the /dashboard page's sections
    "attainment per class over time",
    "queue depth by class",
    "instances: state and loaded model",
    "model swaps and evictions",
    "predicted vs actual wait",
    "prefix-cache reuse",
)


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GRAFANA.read_text())
    return data


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def expressions() -> list[str]:
    return [t["expr"] for p in panels(dashboard()["panels"]) for t in p.get("targets", [])]


def test_every_panel_queries_exported_qlm_metrics_only() -> None:
    exported = exported_names()
    for panel in panels(dashboard()["panels"]):
        if panel["type"] == "row":
            continue
        exprs = [t["expr"] for t in panel["targets"]]
        assert exprs, f"panel {panel['title']!r} has no query"
        used = referenced_names(exprs)
        assert used, f"panel {panel['title']!r} names no qlm_ metric"
        assert used <= set(exported), (panel["title"], sorted(used - set(exported)))
        assert not any("vllm:" in e for e in exprs)
    assert grouping_labels(expressions()) <= set().union(*exported.values())


def test_expressions_are_valid_promql(tmp_path: Path) -> None:
    rules = []
    for i, expr in enumerate(expressions()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"unknown Grafana variable in {expr}"
        rules.append({"record": f"qlm:grafana_panel_{i}", "expr": expr})
    path = tmp_path / "panels.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "grafana", "rules": rules}]}))
    check = subprocess.run(
        [binary("promtool"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_page_panels_are_there_with_unique_ids_and_a_datasource_variable() -> None:
    data = dashboard()
    titles = [p["title"].lower() for p in panels(data["panels"])]
    for wanted in PAGE_PANELS:
        assert any(t.startswith(wanted) for t in titles), wanted
    ids = [p["id"] for p in panels(data["panels"])]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in panels(data["panels"]):
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
