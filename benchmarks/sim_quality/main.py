"""The command line: which scenarios and policies to run (or the calibration), and the results
file, where a new run replaces the old one policy by policy, full and quick sizes side by side."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from benchmarks import sim_quality
from benchmarks.report import (
    RESULTS_DIR,
    code_version,
    command_line,
    machine,
    platform_description,
    write_docs_block,
    write_results,
)
from benchmarks.sim_quality import fuzz
from benchmarks.sim_quality import seeds as multi_seed
from benchmarks.sim_quality.checks import POLICY_ORDER
from benchmarks.sim_quality.render import render
from benchmarks.sim_quality.runs import CALIBRATION_GRID, SCENARIOS, calibrate, run_matrix
from qlm.sim.policies import SIM_POLICIES
from qlm.sim.spread import make_runner

RESULTS_PATH = RESULTS_DIR / "sim_quality.json"
DOCS_BLOCK = "sim-quality"
MACHINE_NOTE = "shared and noisy; sim wall times are indicative"


def load_results() -> dict[str, Any]:
    if RESULTS_PATH.exists():
        data: dict[str, Any] = json.loads(RESULTS_PATH.read_text(encoding="utf-8"))
        return data
    return {}


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """New runs replace old ones policy by policy; a scenario whose file, size or load changed
    starts afresh."""
    out = dict(old)
    same = ("file", "requests", "rate_scale", "seed", "gpus")
    for name, entry in new.items():
        prev = out.get(name)
        if prev is None or any(prev.get(k) != entry.get(k) for k in same):
            out[name] = entry
            continue
        policies = {**prev["policies"], **entry["policies"]}
        timeouts = {**prev.get("timeouts", {}), **entry["timeouts"]}
        for policy in entry["policies"]:
            timeouts.pop(policy, None)
        for policy in entry["timeouts"]:
            policies.pop(policy, None)
        out[name] = {**entry, "policies": policies, "timeouts": timeouts}
    return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(sim_quality.__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick sizes (X-quick.yaml)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="wa,wb,wc")
    parser.add_argument("--policies", help="comma-separated (default: every registered policy)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel runs (processes)")
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run on this Ray cluster instead of local processes (default: $RAY_ADDRESS)",
    )
    parser.add_argument("--seed", type=int, help="seed (default: each scenario's)")
    parser.add_argument(
        "--seeds",
        help="comma-separated seeds, e.g. 0,1,7: each seed's results side by side "
        "(results/sim_quality_seeds.json, block sim-quality-seeds) with a verdict table",
    )
    parser.add_argument("--calibrate", action="store_true", help="fcfs over the load grid only")
    parser.add_argument(
        "--max-run-s",
        type=float,
        help="stop a run after this many wall seconds and report it as not finished",
    )
    parser.add_argument(
        "--random", type=int, metavar="N", help="N random scenarios (qlm/sim/fuzz) instead"
    )
    parser.add_argument(
        "--many", action="store_true", help="with --random N: the many-model family (many:SEED)"
    )
    parser.add_argument(
        "--random-seed-base", type=int, default=0, help="first random seed (default 0)"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if args.many and args.random is None:
        parser.error("--many goes with --random N")
    if args.random is not None and (args.random < 1 or args.calibrate):
        parser.error("--random needs N >= 1 and no --calibrate")
    if args.random_seed_base < 0:
        parser.error("--random-seed-base must be >= 0")
    if args.seeds is not None:
        if args.seed is not None or args.calibrate or args.random is not None:
            parser.error("--seeds goes without --seed, --calibrate and --random")
        try:
            args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError:
            parser.error("--seeds takes comma-separated integers")
        if not args.seeds or len(set(args.seeds)) != len(args.seeds):
            parser.error("--seeds needs at least one seed and no repeats")
    return args


def chosen_policies(args: argparse.Namespace) -> list[str]:
    """--policies (each checked against the registry), or every registered policy in the
    table's order."""
    known = SIM_POLICIES.names()
    policies = (
        [p.strip() for p in args.policies.split(",")]
        if args.policies
        else [p for p in POLICY_ORDER if p in known] + [p for p in known if p not in POLICY_ORDER]
    )
    for p in policies:
        SIM_POLICIES.get(p)
    return policies


def main(argv: Sequence[str]) -> None:
    args = parse_args(argv)
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    known = SIM_POLICIES.names()
    policies = chosen_policies(args)
    runner = make_runner(args.ray)
    if args.random is not None:
        seeds = range(args.random_seed_base, args.random_seed_base + args.random)
        family = "many" if args.many else "random"
        if not args.policies:  # the baselines and qlm; --policies adds the ablations
            baselines = fuzz.FAMILIES[family].baselines
            policies = [p for p in (*baselines, "qlm") if p in known]
        command = command_line("sim_quality.py", argv)
        spec = fuzz.RandomRun(seeds, policies, args.jobs, args.max_run_s, command, runner, family)
        fuzz.main(spec)
        return
    if args.seeds is not None:
        command = command_line("sim_quality.py", argv)
        multi_seed.main(
            multi_seed.SeedsRun(
                names, policies, args.seeds, args.quick, args.jobs, args.max_run_s, command, runner
            )
        )
        return
    size = "quick" if args.quick else "full"
    code = code_version()
    command = command_line("sim_quality.py", argv)
    if args.calibrate:
        print(f"calibrating ({size}): fcfs at rate scales {CALIBRATION_GRID}", flush=True)
        calibration = calibrate(names, args.quick, args.seed, args.jobs, runner)
    else:
        print(f"running {len(names)} scenarios x {len(policies)} policies ({size})", flush=True)
        scenarios = run_matrix(
            names, policies, args.quick, args.seed, args.jobs, args.max_run_s, runner
        )
    # Read the file only now: a run of the other size may have written it meanwhile.
    data = load_results()
    run = data.get(size, {})
    if args.calibrate:
        run["calibration"] = {**run.get("calibration", {}), **calibration}
    else:
        stamp = {"code": code, "date": datetime.now(UTC).isoformat(timespec="seconds")}
        for entry in scenarios.values():
            for summary in entry["policies"].values():
                summary.update(stamp)
        commands = [c for c in run.get("commands", []) if c != command.strip()]
        run.update(
            {
                "commands": [*commands, command.strip()],
                "machine": f"{machine(MACHINE_NOTE)} ({platform_description()})",
                "scenarios": merge(run.get("scenarios", {}), scenarios),
            }
        )
    data[size] = run
    write_results(RESULTS_PATH, data)
    block = render(data)
    write_docs_block(DOCS_BLOCK, block)
    print()
    print(block)
