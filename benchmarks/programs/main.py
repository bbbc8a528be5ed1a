"""Programs against call by call (issue 16, after Parrot), live: `benchmarks/programs/`.

    .venv/bin/python -m benchmarks.programs                 # every application, both loads
    .venv/bin/python -m benchmarks.programs --apps chain --loads light

Three applications (benchmarks/programs/apps.py: a chain summary, a map-reduce summary, two
agents answering each other; lengths from arXiv summarisation) run against the embedded plane
with emulated engines on the packaged A100 profile (sped up; every time below is in engine
seconds), each instance (a) as one program (one POST with an end-to-end deadline, then one
waiting read of the result) and (b) call by call, each call a completion sent once its inputs
came back to the client. Every client exchange pays a round trip (`--rtt-s`, a client in
another data centre). `light`: the instances one after another; `loaded`: Poisson arrivals
that keep several in flight at once, the same arrivals for both modes. Reports end-to-end
latency (mean, p50, p99), the share done by the app's deadline (`--deadline-factor` times its
critical path alone, by the profile) and throughput. Verdicts: a program's mean latency at
most 0.7x call by call's at every point, and its deadline attainment higher under load. The
apps share context across calls as Parrot's do (a paper every call reads, a conversation each
turn extends); the simulator also runs the calls with no prefix information (`calls-unshared`:
a server that shares nothing, Parrot's baseline) and reports the prompt tokens prefilled more
than once per app in each mode.

Writes benchmarks/results/programs.json and the "programs" block of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
from typing import Any

from benchmarks.common.tables import markdown_table
from benchmarks.programs.apps import APPS
from benchmarks.programs.run import Setup, ratios, run_point
from benchmarks.programs.sim import sim_point
from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)

RESULTS_PATH = RESULTS_DIR / "programs.json"
LATENCY_TARGET = 0.7


def setups(args: argparse.Namespace) -> dict[str, Setup]:
    base = Setup(args.apps_per_point, args.rate, args.rtt_s, args.speedup,
                 args.deadline_factor, args.instances, args.seed)  # fmt: skip
    return {"light": replace(base, rate_per_s=None), "loaded": base}


def fmt(value: object, column: str) -> str:
    if isinstance(value, tuple):
        return " / ".join(fmt(v, column) for v in value)
    if isinstance(value, float):
        if "met" in column:
            return f"{100 * value:.0f}%"
        if "twice" in column:
            return f"{value:,.0f}"
        return f"{value:.2f}"
    return str(value)


def verdicts(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for point in points:
        r = ratios(point["rows"])
        program_met, calls_met = r["deadline met (program / calls)"]
        out.append({
            "plane": point["plane"], "load": point["load"], **r,
            f"mean <= {LATENCY_TARGET}x": "PASS" if r["mean latency ratio"] <= LATENCY_TARGET
            else "MISS",
            "met higher": met_higher(point["load"], program_met, calls_met),
            **sharing(point["rows"]),
        })  # fmt: skip
    return out


def sharing(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What sharing context saves (simulator points, which also run the calls without any
    prefix information: a server that shares nothing, Parrot's baseline): prompt tokens
    prefilled more than once per app by mode, and the program's mean latency over that."""
    by_mode = {r["mode"]: r for r in rows}
    unshared = by_mode.get("calls-unshared")
    if unshared is None:
        return {"prefilled twice per app (program / calls / unshared)": "-",
                "mean ratio vs unshared calls": "-"}  # fmt: skip
    twice = tuple(by_mode[m]["prefilled twice per app"] for m in ("program", "calls"))
    return {
        "prefilled twice per app (program / calls / unshared)": (
            *twice, unshared["prefilled twice per app"]),
        "mean ratio vs unshared calls": by_mode["program"]["mean_s"] / unshared["mean_s"],
    }  # fmt: skip


def met_higher(load: str, program_met: float, calls_met: float) -> str:
    """Whether programs met more deadlines than calls under load; both meeting every one
    is a tie (neither can do better), not a pass."""
    if load == "light":
        return "-"
    if program_met == calls_met == 1.0:
        return "tie (all met)"
    return "PASS" if program_met > calls_met else "MISS"


def render(report: dict[str, Any]) -> str:
    s = report["setup"]
    lines = [
        "## Programs against call by call (simulator, and live with emulated engines)",
        "",
        f"{s['instances']} emulated A100 (mistral-7b profile, {s['speedup']}x the wall clock), "
        f"round trip {s['rtt_s']} s per client exchange, deadline {s['deadline_factor']}x an "
        f"app's critical path alone; {s['apps']} instances per point, `loaded`: Poisson at "
        f"{s['rate_per_s']}/s. Times in engine seconds. `program`: one POST and one waiting "
        "read; `calls`: each call a completion once its inputs came back to the client. "
        "The simulator runs the same apps and arrivals (qlm/sim/dependencies.py; `light` "
        "spaces them ten critical paths apart). `alone_s`: the mean latency with nothing "
        "else running, by the profile, every prompt prefilled whole (a program: its critical "
        "path and one round trip; call by call: the longest chain of calls, each with its "
        "round trip): `alone ratio` is what saving round trips alone gives. The apps share "
        "context across calls (a paper every step or map reads, a conversation each turn "
        "extends), so both modes find text cached where an engine computed it; a program's "
        "maps, ready together, wait for the first to compute the paper (Parrot's fork, "
        "qlm/programs/fork.py), where calls sent apart compute it side by side. The "
        "simulator also runs `calls-unshared`: the same calls with no prefix information (a "
        "server that shares nothing, Parrot's baseline). `prefilled twice per app`: prompt "
        "tokens computed beyond each distinct text once.",
        "",
        *header_lines(report["header"]),
        "",
        "### Verdict",
        "",
        markdown_table(verdicts(report["points"]), list(verdicts(report["points"])[0]), fmt),
    ]
    for point in report["points"]:
        rows = point["rows"]
        lines += ["", f"### {point['plane']}: {point['app']}, {point['load']}", "",
                  markdown_table(rows, list(rows[0]), fmt)]  # fmt: skip
    return "\n".join(lines)


def point(plane: str, kind: str, mode: str, setup: Setup) -> dict[str, Any]:
    if plane == "simulator":
        return sim_point(kind, mode, setup)
    return asyncio.run(run_point(kind, mode, setup))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", default=",".join(APPS), help="comma-separated applications")
    parser.add_argument("--loads", default="light,loaded")
    parser.add_argument("--apps-per-point", type=int, default=16)
    parser.add_argument("--rate", type=float, default=4.0, help="loaded: apps per second")
    parser.add_argument("--rtt-s", type=float, default=0.25, help="Parrot added 0.2-0.3 s")
    parser.add_argument("--speedup", type=float, default=1.0)
    parser.add_argument("--deadline-factor", type=float, default=2.0)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    header = run_header("programs.py", argv, "shared")
    chosen = setups(args)
    points = []
    for plane in ("simulator", "live"):
        for kind in args.apps.split(","):
            for load in args.loads.split(","):
                modes = ("program", "calls") + (("calls-unshared",) if plane == "simulator" else ())
                rows = [point(plane, kind, mode, chosen[load]) for mode in modes]
                print(plane, kind, load, rows, flush=True)
                points.append({"plane": plane, "app": kind, "load": load, "rows": rows})
    finish_header(header)
    setup_view = {k: getattr(chosen["loaded"], k) for k in chosen["loaded"].__dataclass_fields__}
    report = {"header": header, "setup": setup_view, "points": points}
    block = render(report)
    print(block)
    if not args.no_docs:
        write_results(RESULTS_PATH, report)
        write_docs_block("programs", block)
    return 0
