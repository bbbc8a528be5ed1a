"""What a rate sweep writes besides each point's own outputs: sweep.json (every point's
summary) and a report.md with attainment and throughput against the rate scale."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qlm.sim.bound import AttainmentBound
from qlm.sim.report.markdown import RunInfo, fleet_line
from qlm.sim.report.plots import plot_sweep
from qlm.sim.report.summary import summary_document
from qlm.sim.report.tables import markdown_table
from qlm.sim.result import SimResult


@dataclass(frozen=True)
class SweepPoint:
    """One rate scale of a sweep: the folder its outputs went to, and its results."""

    rate_scale: float
    folder: str
    results: tuple[SimResult, ...]
    bound: AttainmentBound | None = None  # the clairvoyant bound at this scale


def sweep_document(scenario: str, seed: int, points: Sequence[SweepPoint]) -> dict[str, Any]:
    """sweep.json: {"scenario", "seed", "parameter": "rate_scale", "points": [{"rate_scale",
    "folder", "summary": <summary.json of that point>}]}."""
    return {
        "scenario": scenario,
        "seed": seed,
        "parameter": "rate_scale",
        "points": [
            {
                "rate_scale": p.rate_scale,
                "folder": p.folder,
                "summary": summary_document(
                    scenario, seed, p.results, None if p.bound is None else p.bound.as_dict()
                ),
            }
            for p in points
        ],
    }


def write_sweep_report(out_dir: Path, info: RunInfo, points: Sequence[SweepPoint]) -> Path:
    """sweep_attainment.png, sweep_throughput.png and report.md over all rate points."""
    policies = list(dict.fromkeys(r.policy for p in points for r in p.results))
    scales = [p.rate_scale for p in points]
    for metric, ylabel, name in (
        ("attainment", "SLO attainment (%)", "sweep_attainment.png"),
        ("throughput", "throughput (requests/s)", "sweep_throughput.png"),
    ):
        series = {policy: [_metric(p, policy, metric) for p in points] for policy in policies}
        plot_sweep(out_dir / name, scales, series, ylabel)
    lines = [f"# Rate sweep: {info.scenario.name}", ""]
    if info.command:
        lines += [f"Command: `{info.command}`  ", ""]
    lines += [f"Seed: {info.seed}  ", f"Fleet: {fleet_line(info.scenario)}", ""]
    lines += ["![attainment](sweep_attainment.png)", "", "![throughput](sweep_throughput.png)", ""]
    for p in points:
        lines += [f"## rate x {p.rate_scale:g} ([details]({p.folder}/report.md))", ""]
        lines += [markdown_table(p.results), ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _metric(point: SweepPoint, policy: str, metric: str) -> float:
    for r in point.results:
        if r.policy == policy:
            return 100.0 * r.attainment() if metric == "attainment" else r.throughput_rps
    return math.nan
