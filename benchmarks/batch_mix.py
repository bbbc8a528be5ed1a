"""Batch jobs beside interactive traffic (issue 15): sims/batch-mix.yaml on the simulator.

    .venv/bin/python -m benchmarks.batch_mix                 # seeds 0, 1, 7
    .venv/bin/python -m benchmarks.batch_mix --seeds 1

Runs qlm, llmd (priority ordering, as llm-d's batch gateway) and fcfs on the scenario (a
2,000-request batch job due within 900 s, over a bursty interactive stream) and on its
interactive stream alone. Reports, per policy: the share of the job's requests done by the
job's deadline, interactive p99 TTFT beside the same policy's interactive-only p99, the job's
throughput (its requests over the time its last one took) and the prefix-token reuse.
Verdicts (qlm): >= 95 % of the job on time, interactive p99 TTFT within 1.5x of its
interactive-only run.

Then the job's throughput with and without planning it as a whole (qlm/prefixes/job_plan.py):
sims/batch-job.yaml (a 2,000-request job alone, shared document prefixes, varied answer
lengths, due far ahead so the fleet runs it as fast as it can) under qlm with its `job_plan` on
and off, fcfs and llmd beside (they ignore the plan), with each run's prefix-token reuse and the
oracle's (one infinite cache). Verdict: planned qlm's throughput above unplanned qlm's at every
seed. The live run with emulated engines is not here yet.

Writes benchmarks/results/batch_mix.json and the "batch-mix" block of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from benchmarks.common.stats import percentile
from benchmarks.common.tables import markdown_table
from benchmarks.report import (
    RESULTS_DIR,
    ROOT,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.sim.report.prefix import scenario_oracle_reuse
from qlm.sim.result import OutcomeState, SimResult
from qlm.sim.scenario import Scenario, load_scenario
from qlm.sim.simulate import SimulatedEngines, simulate

RESULTS_PATH = RESULTS_DIR / "batch_mix.json"
POLICIES = ("fcfs", "llmd", "qlm")
JOB_CLASS = "batch-job"
JOB_TARGET = 0.95
P99_RATIO_TARGET = 1.5


def run(scenario: Scenario, policy: str, seed: int, interactive_only: bool) -> SimResult:
    requests = scenario.requests(seed)
    if interactive_only:
        requests = [r for r in requests if r.slo_class != JOB_CLASS]
    engines = SimulatedEngines(scenario.engine)
    return simulate(
        scenario.fleet(), requests, policy, scenario.config, seed, engine_factory=engines
    )


def row(policy: str, mixed: SimResult, alone: SimResult) -> dict[str, Any]:
    job = [o for o in mixed.outcomes if o.slo_class == JOB_CLASS]
    finished = [o.finish_s for o in job if o.state is OutcomeState.COMPLETED and o.finish_s]
    start = min(o.arrival_s for o in job)
    span_s = max(finished) - start if finished else None
    p99 = _ttft_p99(mixed)
    p99_alone = _ttft_p99(alone)
    reuse = mixed.prefix_reuse()
    return {
        "policy": policy,
        "job on time": sum(o.met_slo for o in job) / len(job),
        "job done": len(finished) / len(job),
        "job rps": len(finished) / span_s if span_s else None,
        "interactive attainment": mixed.attainment("interactive"),
        "interactive p99 ttft_s": p99,
        "alone p99 ttft_s": p99_alone,
        "p99 ratio": p99 / p99_alone if p99 is not None and p99_alone else None,
        "reuse": None if reuse is None else reuse["reuse"],
    }


def _ttft_p99(result: SimResult) -> float | None:
    ttfts = [o.ttft_s for o in result.outcomes if o.slo_class == "interactive"]
    return percentile([t for t in ttfts if t is not None], 0.99)


def run_seed(scenario: Scenario, seed: int) -> dict[str, Any]:
    rows = []
    for policy in POLICIES:
        mixed = run(scenario, policy, seed, interactive_only=False)
        alone = run(scenario, policy, seed, interactive_only=True)
        rows.append(row(policy, mixed, alone))
        print(f"seed {seed} {policy}: {rows[-1]}", flush=True)
    return {"seed": seed, "rows": rows}


def throughput_seed(scenario: Scenario, seed: int) -> dict[str, Any]:
    """The job alone, planned and not: requests per second over its makespan, and reuse."""
    rows = []
    for policy, planned in (("fcfs", False), ("llmd", False), ("qlm", False), ("qlm", True)):
        streams = tuple(s.model_copy(update={"job_plan": planned}) for s in scenario.workload)
        variant = scenario.model_copy(update={"workload": streams})
        result = run(variant, policy, seed, interactive_only=False)
        finished = [o.finish_s for o in result.outcomes if o.finish_s is not None]
        start = min(o.arrival_s for o in result.outcomes)
        makespan_s = max(finished) - start if finished else None
        reuse = result.prefix_reuse()
        rows.append(
            {
                "policy": policy,
                "job plan": "on" if planned else "off",
                "done": len(finished) / len(result.outcomes),
                "makespan_s": makespan_s,
                "job rps": len(finished) / makespan_s if makespan_s else None,
                "reuse": None if reuse is None else reuse["reuse"],
            }
        )
        print(f"seed {seed} throughput {rows[-1]}", flush=True)
    oracle = scenario_oracle_reuse(scenario, seed)
    return {"seed": seed, "oracle reuse": oracle, "rows": rows}


def throughput_verdict(point: dict[str, Any]) -> dict[str, Any]:
    qlm = {r["job plan"]: r for r in point["rows"] if r["policy"] == "qlm"}
    on, off = qlm["on"]["job rps"], qlm["off"]["job rps"]
    ratio = on / off if on and off else None
    return {
        "seed": point["seed"],
        "qlm rps, plan on": on,
        "plan off": off,
        "ratio": ratio,
        "reuse on / off / oracle": f"{100 * (qlm['on']['reuse'] or 0):.1f}% / "
        f"{100 * (qlm['off']['reuse'] or 0):.1f}% / {100 * (point['oracle reuse'] or 0):.1f}%",
        "plan raises throughput": "PASS" if ratio is not None and ratio > 1 else "MISS",
    }


def verdict(point: dict[str, Any]) -> dict[str, Any]:
    qlm = next(r for r in point["rows"] if r["policy"] == "qlm")
    ratio = qlm["p99 ratio"]
    return {
        "seed": point["seed"],
        "qlm job on time": f"{100 * qlm['job on time']:.1f}%",
        ">= 95 %": "PASS" if qlm["job on time"] >= JOB_TARGET else "MISS",
        "qlm interactive p99 / alone": "-" if ratio is None else f"{ratio:.2f}",
        "<= 1.5x": "PASS" if ratio is not None and ratio <= P99_RATIO_TARGET else "MISS",
    }


def fmt(value: object, column: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if column in ("job on time", "job done", "interactive attainment", "reuse", "done"):
            return f"{100 * value:.1f}%"
        return f"{value:.2f}"
    return str(value)


def render(report: dict[str, Any]) -> str:
    lines = [
        "## Batch jobs beside interactive traffic (simulator)",
        "",
        "sims/batch-mix.yaml: a 2,000-request job due within 900 s of its submission (shared "
        "document prefixes) over a bursty interactive stream, 2 A10 + 3 A100. `job on time`: "
        "the job's requests done by its deadline; `p99 ratio`: interactive p99 TTFT over the "
        "same policy's on the interactive stream alone; `job rps`: the job's requests over the "
        "time its last one took; `reuse`: prompt tokens found in the engines' prefix caches.",
        "",
        *header_lines(report["header"]),
        "",
        "### Verdict (qlm)",
        "",
        markdown_table(
            [verdict(p) for p in report["points"]], list(verdict(report["points"][0])), fmt
        ),
    ]
    for point in report["points"]:
        columns = list(point["rows"][0])
        lines += ["", f"### Seed {point['seed']}", "", markdown_table(point["rows"], columns, fmt)]
    lines += render_throughput(report["throughput"])
    return "\n".join(lines)


def render_throughput(points: list[dict[str, Any]]) -> list[str]:
    verdicts = [throughput_verdict(p) for p in points]
    lines = [
        "",
        "### A job planned as a whole (sims/batch-job.yaml)",
        "",
        "The job alone (2,000 requests, 4 instructions x 150 documents of 2,000 tokens, Azure "
        "answer lengths), due far ahead: `job rps` is its requests over its makespan. qlm with "
        "the job's plan (qlm/prefixes/job_plan.py: groups by shared prefix, long decodes "
        "first, parts one engine holds, a leader per part computing the prefix first) and "
        "without; fcfs and llmd ignore the plan. `reuse`: prompt tokens found cached.",
        "",
        markdown_table(verdicts, list(verdicts[0]), fmt),
    ]
    for point in points:
        columns = list(point["rows"][0])
        lines += ["", f"Seed {point['seed']}:", "", markdown_table(point["rows"], columns, fmt)]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,7", help="comma-separated seeds")
    args = parser.parse_args(argv)
    header = run_header("batch_mix.py", sys.argv[1:] if argv is None else argv, "shared")
    scenario = load_scenario(ROOT / "sims" / "batch-mix.yaml")
    seeds = [int(s) for s in args.seeds.split(",")]
    points = [run_seed(scenario, seed) for seed in seeds]
    job = load_scenario(ROOT / "sims" / "batch-job.yaml")
    throughput = [throughput_seed(job, seed) for seed in seeds]
    finish_header(header)
    report: dict[str, Any] = {"header": header, "points": points, "throughput": throughput}
    write_results(RESULTS_PATH, report)
    block = render(report)
    print(block)
    write_docs_block("batch-mix", block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
