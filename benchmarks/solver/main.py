"""The command line: the cases and repeats to run, then the results file and the solver block of
docs/benchmarks.md."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict

from benchmarks import solver
from benchmarks.report import (
    DOCS_PATH,
    RESULTS_DIR,
    ROOT,
    finish_header,
    run_header,
    write_docs_block,
    write_results,
)
from benchmarks.solver.inputs import CASES
from benchmarks.solver.render import render
from benchmarks.solver.runs import BACKENDS, run_case, run_grouping, warm_up
from benchmarks.solver.targets import GROUPING_TARGET_REQUESTS, evaluate_targets, summarise
from qlm.config import PlannerConfig

RESULTS_PATH = RESULTS_DIR / "solver.json"
DOCS_BLOCK = "solver"
MACHINE_NOTE = "noisy; compare ratios within one run"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(solver.__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 repeat, the two small sizes")
    parser.add_argument("--repeats", type=int, default=5, help="seeds per size (default 5)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def main(argv: Sequence[str]) -> None:
    args = parse_args(argv)
    cases = CASES[:2] if args.quick else CASES
    repeats = 1 if args.quick else args.repeats
    header = run_header("solver.py", argv, MACHINE_NOTE)  # before the runs: code may change
    warm_up()
    runs = [run for case in cases for run in run_case(case, repeats)]
    planners = ("edf", *(f"milp/{b}" for b in BACKENDS))
    summaries = [summarise(runs, case, p) for case in cases for p in planners]
    print("grouping benchmark ...", file=sys.stderr)
    grouping = run_grouping(10_000 if args.quick else GROUPING_TARGET_REQUESTS)
    finish_header(header)
    report = {
        **header,
        "cases": [asdict(c) for c in cases],
        "repeats": repeats,
        "planner_defaults": _planner_defaults(),
        "targets": evaluate_targets(summaries, grouping),
        "summaries": summaries,
        "grouping": grouping,
        "runs": runs,
    }
    block = render(report)
    print(block)
    write_results(RESULTS_PATH, report)
    write_docs_block(DOCS_BLOCK, block)
    print(
        f"wrote {RESULTS_PATH.relative_to(ROOT)} and {DOCS_PATH.relative_to(ROOT)}", file=sys.stderr
    )


def _planner_defaults() -> str:
    config = PlannerConfig()
    return (
        f"max_slots_per_queue {config.max_slots_per_queue}, max_planning_groups "
        f"{config.max_planning_groups}, threads {config.threads}, warm_start {config.warm_start}"
    )
