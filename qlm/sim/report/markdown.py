"""report.md of one run: what was simulated (scenario, seed, fleet, request mix), the summary
table, a note on how each number is measured, and the four plots it links."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qlm.sim.report.plots import (
    PLOTS,
    plot_attainment,
    plot_queue,
    plot_swaps,
    plot_ttft_cdf,
)
from qlm.sim.report.tables import causes_markdown_table, markdown_table
from qlm.sim.result import SimResult
from qlm.sim.scenario import Scenario


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
        f"Fleet: {fleet_line(scenario)}  ",
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
        "that produced a token; TBT (time between tokens) over completed requests of two "
        "tokens or more, each its decode time over its tokens after the first. sim wall s is "
        "this machine's wall time for the run.",
        "",
        "## Why requests missed",
        "",
        causes_markdown_table(results),
        "",
        _CAUSES_NOTE,
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


_CAUSES_NOTE = (
    "One cause per missed request (requests.csv: miss_cause), from what the simulator saw of it, "
    "the first that applies: failed (an engine dropped it); unfinished (the run ended before "
    "its deadline passed); evicted (an engine let it go before its first token, or at all when "
    "that token was on time); then, for a late or missing first token, the largest share of "
    "its time to that token (to the run's end if none): no_instance (queued while no instance "
    "had its model loaded or loading), model_load (queued while its model was loading), queued "
    "(queued while an instance had its model), in_engine (held by an engine before its first "
    "token); else slow_decode (first token on time, completion deadline missed)."
)


def fleet_line(scenario: Scenario) -> str:
    """GPU counts by type and the fleet's cost per hour."""
    counts = ", ".join(f"{n} x {gpu}" for gpu, n in scenario.fleet_counts().items() if n)
    return f"{counts} instances; {scenario.fleet_cost_per_hour():.1f} per hour"


def _mix_line(results: Sequence[SimResult]) -> str:
    if not results:
        return "none"
    by_class: dict[str, int] = {}
    for o in results[0].outcomes:
        by_class[o.slo_class] = by_class.get(o.slo_class, 0) + 1
    return ", ".join(f"{c} {n}" for c, n in by_class.items())
