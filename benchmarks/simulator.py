"""Simulator benchmarks: speed (this file) and quality (benchmarks/sim_quality/, run through
the `quality` subcommand), one entry point.

    .venv/bin/python -m benchmarks.simulator [speed] [--cases wa-qlm,fcfs-1m] [--requests N]
        [--profile CASE]
    .venv/bin/python -m benchmarks.simulator quality [sim_quality.py's arguments]

Speed targets (issue 3): full-size WA (3,500 requests, 80 GPUs) under `qlm` in <= 20 s wall on
one core; 1,000,000 requests on 100 instances under `fcfs` in <= 5 minutes; events per second.
`speed` prints a Markdown report, writes benchmarks/results/simulator.json and the simulator
block of docs/benchmarks.md. `--profile CASE` runs one case under cProfile instead and prints
the top functions by own time (nothing is written).

Cases:

* wa-qlm: sims/wa-quick.yaml's workload (the paper's 3,500 requests: 1,500 interactive from the
  Azure conversation trace over a backlog of 2,000 batch-2) on the paper's fleet (30 A10 + 50
  A100, Mistral-7B), policy qlm with the default planner (MILP, CP-SAT, 0.8 s limit).
* many-qlm: many models, few GPUs (qlm/sim/fuzz/many_models.py `many:77`: 32 models, each a
  copy of a packaged 7B/13B/70B profile that must be loaded, on 8 instances; about 1,500
  requests at the benchmark's seed),
  policy qlm: the planner-cost target of the many-model issue (a 1,500-request run on a
  30-model, 8-instance fleet in <= 30 s, <= 10 ms of planner time per request).
* fcfs-1m: 1,000,000 requests, Poisson at 900 req/s (about 85% of what 100 A100s serve at the
  Azure conversation lengths), lengths drawn from the Azure trace, a third of each SLO class,
  on 100 A100s with Mistral-7B, policy fcfs.

Wall time is measured around `simulate()` only; generating the requests is reported apart.
CPU time (process time) is reported too: on a shared machine it is the steadier figure.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import runpy
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.report import (
    RESULTS_DIR,
    ROOT,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.sim.result import SimResult
from qlm.sim.scenario import Scenario, load_scenario
from qlm.sim.simulate import simulate
from qlm.types import Request

HERE = ROOT / "benchmarks"
RESULTS_PATH = RESULTS_DIR / "simulator.json"
DOCS_BLOCK = "simulator"
MACHINE_NOTE = "shared and noisy"
TRACE = ROOT / "sims" / "data" / "azure_llm_2023_conv.csv"
SEED = 1


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    policy: str
    target_wall_s: float
    scenario: Callable[[int | None], Scenario]


def wa_full(_: int | None) -> Scenario:
    quick = load_scenario(ROOT / "sims" / "wa-quick.yaml")
    return quick.with_fleet_counts({"A10": 30, "A100": 50})


def poisson_million(count: int | None) -> Scenario:
    instances = 100
    data = {
        "name": "fcfs-1m",
        "seed": SEED,
        "fleet": {"instances": [{"gpu_type": "A100", "count": instances, "model": "mistral-7b"}]},
        "workload": [
            {
                "name": "p",
                "arrivals": {"process": "poisson", "rate_per_s": 9.0 * instances},
                "count": count or 1_000_000,
                "models": {"mistral-7b": 1},
                "classes": {"interactive": 1, "batch-1": 1, "batch-2": 1},
                "lengths": {"source": "trace", "path": str(TRACE), "format": "azure"},
            }
        ],
    }
    return Scenario.model_validate(data)


def many_models(_: int | None) -> Scenario:
    return load_scenario(Path("many:77"))


CASES = {
    case.name: case
    for case in (
        Case("wa-qlm", "full-size WA (3,500 requests, 80 GPUs), qlm", "qlm", 20.0, wa_full),
        Case("many-qlm", "32 models on 8 instances (many:77), qlm", "qlm", 30.0, many_models),
        Case(
            "fcfs-1m",
            "1,000,000 requests on 100 instances, fcfs",
            "fcfs",
            300.0,
            poisson_million,
        ),
    )
}


def run_case(case: Case, count: int | None) -> dict[str, Any]:
    scenario = case.scenario(count)
    started = time.perf_counter()
    requests: list[Request] = scenario.requests(SEED)
    generate_s = time.perf_counter() - started
    fleet = scenario.fleet()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = simulate(fleet, requests, case.policy, scenario.config, SEED)
    wall_s = time.perf_counter() - wall0
    cpu_s = time.process_time() - cpu0
    return _record(case, scenario, result, len(fleet.instances), generate_s, wall_s, cpu_s)


def _record(
    case: Case,
    scenario: Scenario,
    result: SimResult,
    instances: int,
    generate_s: float,
    wall_s: float,
    cpu_s: float,
) -> dict[str, Any]:
    return {
        "case": case.name,
        "title": case.title,
        "scenario": scenario.name,
        "policy": case.policy,
        "requests": result.num_requests,
        "instances": instances,
        "generate_s": round(generate_s, 3),
        "wall_s": round(wall_s, 3),
        "cpu_s": round(cpu_s, 3),
        "target_wall_s": case.target_wall_s,
        "pass": wall_s <= case.target_wall_s,
        "events": result.events_processed,
        "events_per_wall_s": round(result.events_processed / wall_s),
        "events_per_cpu_s": round(result.events_processed / cpu_s),
        "simulated_s": round(result.duration_s, 3),
        "speedup_over_real_time": round(result.duration_s / wall_s, 1),
        "planner_wall_s": round(result.planner_wall_s, 3),
        "replans": result.policy_stats.get("replans", 0),
        "attainment": round(result.attainment(), 4),
        "throughput_rps": round(result.throughput_rps, 2),
    }


def profile_case(case: Case, count: int | None, top: int = 30) -> None:
    scenario = case.scenario(count)
    requests = scenario.requests(SEED)
    profiler = cProfile.Profile()
    profiler.enable()
    simulate(scenario.fleet(), requests, case.policy, scenario.config, SEED)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


# --- report ---------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    lines = [
        "## Simulator speed",
        "",
        *header_lines(report),
        "",
        "Wall time around `simulate()` (requests generated beforehand: generate s); CPU is the "
        "process time of the same call, the steadier figure on a shared machine. Events: "
        "handlers the event loop ran (arrivals, engine wake-ups, policy timers, samples); an "
        "engine wakes once per run of identical decode steps, not per token. qlm runs the "
        "production Controller (k-means, RWT, EDF improved by local search, then MILP on "
        "CP-SAT within a budget of 5 ms per request arrived since the last re-plan, at most "
        "0.8 s) and reconcile; planner wall s is the part of the wall time spent re-planning "
        "and checking for violations, planner ms / request that divided by the requests. The "
        "virtual clock charges each MILP re-plan its solver budget, not the measured solve "
        "time (qlm/sim/policies/README.md).",
        "",
        "| target | requests | instances | wall s | target s | result | CPU s | generate s "
        "| events | events / wall s | events / CPU s | simulated s | x real time "
        "| planner wall s | planner ms / request | replans | attainment |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['title']} | {r['requests']:,} | {r['instances']} | {r['wall_s']:.1f} "
            f"| {r['target_wall_s']:.0f} | {'PASS' if r['pass'] else 'MISS'} | {r['cpu_s']:.1f} "
            f"| {r['generate_s']:.1f} | {r['events']:,} | {r['events_per_wall_s']:,} "
            f"| {r['events_per_cpu_s']:,} | {r['simulated_s']:.0f} "
            f"| {r['speedup_over_real_time']:.0f} | {r['planner_wall_s']:.1f} "
            f"| {1000 * r['planner_wall_s'] / max(1, r['requests']):.1f} | {r['replans']} "
            f"| {100 * r['attainment']:.1f}% |"
        )
    if report.get("notes"):
        lines += ["", *report["notes"]]
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------


def speed(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="simulator.py speed", description=__doc__)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument(
        "--requests", type=int, default=None, help="override fcfs-1m's request count"
    )
    parser.add_argument("--profile", choices=sorted(CASES), help="cProfile one case instead")
    args = parser.parse_args(argv)
    if args.profile:
        profile_case(CASES[args.profile], args.requests)
        return
    header = run_header("simulator.py", ["speed", *argv], MACHINE_NOTE)
    runs = []
    for name in args.cases.split(","):
        record = run_case(CASES[name], args.requests)
        print(json.dumps(record), flush=True)
        runs.append(record)
    finish_header(header)
    report = {**header, "runs": runs}
    block = render(report)
    print(block)
    write_results(RESULTS_PATH, report)
    write_docs_block(DOCS_BLOCK, block)


def main(argv: Sequence[str]) -> None:
    if argv and argv[0] == "quality":
        sys.argv = [str(HERE / "sim_quality.py"), *argv[1:]]
        runpy.run_path(str(HERE / "sim_quality.py"), run_name="__main__")
        return
    speed(argv[1:] if argv and argv[0] == "speed" else argv)


if __name__ == "__main__":
    main(sys.argv[1:])
