"""What `qlm simulate` writes: requests.csv, summary.json, report.md with PNG plots, and the
summary table it prints. Formats are documented in qlm/sim/README.md.

Plots use matplotlib's object API (Figure + the Agg canvas), never pyplot's global state.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from qlm.sim.result import SimResult
from qlm.sim.scenario import Scenario

CSV_COLUMNS = (
    "policy",
    "id",
    "class",
    "model",
    "instance",
    "arrival_s",
    "dispatch_s",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "met_slo",
    "evictions",
    "state",
)
SUMMARY_KEYS = (
    "requests",
    "slo_attainment",
    "throughput_rps",
    "goodput_rps",
    "ttft_p50_s",
    "ttft_p99_s",
    "swaps",
    "evictions",
    "sim_wall_s",
)
PLOTS = {
    "attainment": "attainment.png",
    "ttft": "ttft_cdf.png",
    "queue": "queue_length.png",
    "swaps": "swaps_per_instance.png",
}


# --- summary.json ----------------------------------------------------------------------------


def policy_summary(result: SimResult) -> dict[str, Any]:
    """One policy's entry of summary.json; NaN (no first token at all) becomes null."""
    raw = result.summary()
    return {key: _finite(raw[key]) for key in SUMMARY_KEYS}


def summary_document(scenario: str, seed: int, results: Sequence[SimResult]) -> dict[str, Any]:
    """summary.json: {"scenario", "seed", "policies": {name: policy_summary}}."""
    return {
        "scenario": scenario,
        "seed": seed,
        "policies": {r.policy: policy_summary(r) for r in results},
    }


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")


# --- requests.csv ----------------------------------------------------------------------------


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


def write_requests_csv(path: Path, results: Iterable[SimResult]) -> int:
    """One row per request and policy (columns CSV_COLUMNS; empty cell = never happened).
    Returns the rows written."""
    rows = 0
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for result in results:
            for o in result.outcomes:
                writer.writerow(
                    (
                        result.policy,
                        o.request_id,
                        o.slo_class,
                        o.model,
                        o.instance_id or "",
                        _cell(o.arrival_s),
                        _cell(o.dispatch_s),
                        _cell(o.first_token_s),
                        _cell(o.finish_s),
                        _cell(o.ttft_s),
                        int(o.met_slo),
                        o.evictions,
                        str(o.state),
                    )
                )
                rows += 1
    return rows


# --- the printed table -----------------------------------------------------------------------


def class_names(results: Sequence[SimResult]) -> list[str]:
    """SLO classes present in any result, in configuration order."""
    present = {o.slo_class for r in results for o in r.outcomes}
    order = results[0].slo_classes if results else ()
    return [c for c in order if c in present]


def summary_table(results: Sequence[SimResult]) -> str:
    """A fixed-width table: attainment overall and per class, throughput, TTFT, swaps."""
    classes = class_names(results)
    head = ["policy", "overall", *classes, "thru_rps", "good_rps", "ttft_p50", "ttft_p99"]
    head += ["swaps", "evict", "wall_s"]
    rows = [head]
    for r in results:
        s = policy_summary(r)
        att = s["slo_attainment"]
        rows.append(
            [
                r.policy,
                _pct(att["overall"]),
                *(_pct(att.get(c)) for c in classes),
                f"{s['throughput_rps']:.2f}",
                f"{s['goodput_rps']:.2f}",
                _secs(s["ttft_p50_s"]),
                _secs(s["ttft_p99_s"]),
                str(s["swaps"]),
                str(s["evictions"]),
                f"{s['sim_wall_s']:.1f}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join(lines)


def markdown_table(results: Sequence[SimResult]) -> str:
    classes = class_names(results)
    head = ["policy", "overall", *classes, "throughput rps", "goodput rps"]
    head += ["TTFT p50 s", "TTFT p99 s", "swaps", "evictions", "sim wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        s = policy_summary(r)
        att = s["slo_attainment"]
        cells = [
            r.policy,
            _pct(att["overall"]),
            *(_pct(att.get(c)) for c in classes),
            f"{s['throughput_rps']:.3f}",
            f"{s['goodput_rps']:.3f}",
            _secs(s["ttft_p50_s"]),
            _secs(s["ttft_p99_s"]),
            str(s["swaps"]),
            str(s["evictions"]),
            f"{s['sim_wall_s']:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.1f}%"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# --- plots -----------------------------------------------------------------------------------


def _figure(width: float = 8.0, height: float = 4.5) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})


def plot_attainment(path: Path, results: Sequence[SimResult]) -> None:
    """Grouped bars: SLO attainment overall and per class, one bar per policy."""
    classes = ["overall", *class_names(results)]
    fig = _figure()
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(results))
    x = np.arange(len(classes))
    for k, r in enumerate(results):
        att = policy_summary(r)["slo_attainment"]
        values = [100.0 * (att.get(c) or 0.0) for c in classes]
        ax.bar(x + (k - (len(results) - 1) / 2) * width, values, width, label=r.policy)
    ax.set_xticks(x, classes)
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(0, 105)
    ax.set_title("SLO attainment by class")
    ax.legend(fontsize="small", ncols=min(4, len(results)))
    _save(fig, path)


def plot_ttft_cdf(
    path: Path, results: Sequence[SimResult], slo_ttft_s: Mapping[str, float]
) -> None:
    """Empirical CDF of time to first token per policy (requests that never produced a token
    keep the curve below 1); dotted lines at each class's TTFT target."""
    fig = _figure()
    ax = fig.add_subplot()
    for r in results:
        ttfts = np.sort([o.ttft_s for o in r.outcomes if o.ttft_s is not None])
        if len(ttfts) == 0:
            continue
        y = np.arange(1, len(ttfts) + 1) / max(1, r.num_requests)
        ax.step(np.maximum(ttfts, 1e-3), y, where="post", label=r.policy)
    for name, target in slo_ttft_s.items():
        ax.axvline(target, linestyle=":", color="grey")
        ax.text(target, 0.02, f" {name}", rotation=90, fontsize="x-small", color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s, log scale)")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title("TTFT distribution")
    ax.legend(fontsize="small")
    _save(fig, path)


def plot_queue(path: Path, results: Sequence[SimResult]) -> None:
    """Waiting requests (arrived, no token yet) over time by class, one panel per policy."""
    fig = _figure(8.0, 2.2 * max(1, len(results)) + 0.6)
    axes = fig.subplots(max(1, len(results)), 1, sharex=True, squeeze=False)[:, 0]
    for ax, r in zip(axes, results, strict=False):
        samples = r.queue_samples
        if samples:
            step = max(1, len(samples) // 2000)
            t = np.asarray([s.at_s for s in samples[::step]])
            waiting = np.asarray([s.waiting for s in samples[::step]])
            for k, name in enumerate(r.slo_classes):
                if waiting[:, k].any():
                    ax.plot(t, waiting[:, k], label=name, linewidth=1, drawstyle="steps-post")
        ax.set_ylabel("waiting")
        ax.set_title(r.policy, fontsize="small", loc="left")
        ax.legend(fontsize="x-small", loc="upper right")
    axes[-1].set_xlabel("simulated time (s)")
    _save(fig, path)


def plot_swaps(path: Path, results: Sequence[SimResult]) -> None:
    """Model loads per instance: grouped bars for small fleets, a heat map for large ones."""
    instances = sorted({i for r in results for i in r.swaps})
    fig = _figure(max(8.0, min(20.0, 0.25 * len(instances))), 4.5)
    ax = fig.add_subplot()
    counts = np.asarray([[r.swaps.get(i, 0) for i in instances] for r in results], dtype=float)
    if len(instances) <= 24:
        width = 0.8 / max(1, len(results))
        x = np.arange(len(instances))
        for k, r in enumerate(results):
            ax.bar(x + (k - (len(results) - 1) / 2) * width, counts[k], width, label=r.policy)
        ax.set_xticks(x, instances, rotation=60, ha="right", fontsize="small")
        ax.set_ylabel("model swaps")
        ax.legend(fontsize="small")
    else:
        image = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_yticks(np.arange(len(results)), [r.policy for r in results])
        ax.set_xlabel(f"instance (0..{len(instances) - 1}, sorted by id)")
        fig.colorbar(image, ax=ax, label="model swaps")
    ax.set_title("Model swaps per instance")
    _save(fig, path)


# --- report.md -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunInfo:
    """What the report says about the run besides the results."""

    scenario: Scenario
    seed: int
    command: str = ""


def write_report(out_dir: Path, info: RunInfo, results: Sequence[SimResult]) -> Path:
    """The four PNG plots and report.md (which links them) in out_dir."""
    slo_ttft = {c.name: c.ttft_s for c in info.scenario.slo_classes}
    plot_attainment(out_dir / PLOTS["attainment"], results)
    plot_ttft_cdf(out_dir / PLOTS["ttft"], results, slo_ttft)
    plot_queue(out_dir / PLOTS["queue"], results)
    plot_swaps(out_dir / PLOTS["swaps"], results)
    path = out_dir / "report.md"
    path.write_text(_report_text(info, results), encoding="utf-8")
    return path


def _report_text(info: RunInfo, results: Sequence[SimResult]) -> str:
    scenario = info.scenario
    lines = [f"# Simulation report: {scenario.name}", ""]
    if scenario.description:
        lines += [scenario.description.strip(), ""]
    if info.command:
        lines += [f"Command: `{info.command}`  ", ""]
    lines += [
        f"Seed: {info.seed}  ",
        f"Fleet: {_fleet_line(scenario)}  ",
        f"Requests: {results[0].num_requests if results else 0} ({_mix_line(results)})",
        "",
        "## Summary",
        "",
        markdown_table(results),
        "",
        "Attainment: share of requests whose first token came by their class's TTFT target "
        "(and that finished by a completion target, where the class has one). Throughput: "
        "completed requests per simulated second from the first arrival to the end of the run; "
        "goodput counts only requests that met their SLO. TTFT percentiles are over requests "
        "that produced a token. sim wall s is this machine's wall time for the run.",
        "",
        "## SLO attainment by class",
        "",
        f"![attainment]({PLOTS['attainment']})",
        "",
        "## Time to first token",
        "",
        f"![ttft]({PLOTS['ttft']})",
        "",
        "## Queue length over time",
        "",
        f"![queue]({PLOTS['queue']})",
        "",
        "## Model swaps per instance",
        "",
        f"![swaps]({PLOTS['swaps']})",
        "",
    ]
    return "\n".join(lines)


def _fleet_line(scenario: Scenario) -> str:
    counts = ", ".join(f"{n} x {gpu}" for gpu, n in scenario.fleet_counts().items() if n)
    return f"{counts} instances; {scenario.fleet_cost_per_hour():.1f} per hour"


def _mix_line(results: Sequence[SimResult]) -> str:
    if not results:
        return "none"
    by_class: dict[str, int] = {}
    for o in results[0].outcomes:
        by_class[o.slo_class] = by_class.get(o.slo_class, 0) + 1
    return ", ".join(f"{c} {n}" for c, n in by_class.items())


# --- sweeps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    rate_scale: float
    folder: str
    results: tuple[SimResult, ...]


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
                "summary": summary_document(scenario, seed, p.results),
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
        fig = _figure()
        ax = fig.add_subplot()
        for policy in policies:
            ys = [_metric(p, policy, metric) for p in points]
            ax.plot(scales, ys, marker="o", label=policy)
        ax.set_xscale("log")
        ax.set_xlabel("arrival rate scale")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize="small")
        _save(fig, out_dir / name)
    lines = [f"# Rate sweep: {info.scenario.name}", ""]
    if info.command:
        lines += [f"Command: `{info.command}`  ", ""]
    lines += [f"Seed: {info.seed}  ", f"Fleet: {_fleet_line(info.scenario)}", ""]
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
