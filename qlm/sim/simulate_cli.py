"""Subcommands of `qlm` (see qlm/cli.py): `simulate` (here) and `capacity` (capacity_cli.py).

    qlm simulate SCENARIO.yaml [--policy NAME]... [--seed N] [--out DIR]
                 [--sweep rate=0.5,1,2,4] [--quick] [--no-progress]
    qlm capacity SCENARIO.yaml --target 0.99 [--policy qlm] [--gpu-types A10,A100]
                 [--cost A10=1.0,A100=3.7] [--max-count N] [--class NAME] [--seed N] [--out FILE]

Output formats: qlm/sim/README.md.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from qlm.config import ConfigError
from qlm.sim.capacity_cli import add_capacity

if TYPE_CHECKING:  # the heavy modules load when a command runs, not when `qlm` starts
    from qlm.sim.bound import AttainmentBound
    from qlm.sim.report import RunInfo
    from qlm.sim.result import SimResult
    from qlm.sim.scenario import Scenario

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


# Compared by default: the baselines and QLM (the ablations only when named).
DEFAULT_POLICIES = ("fcfs", "edf", "shepherd", "llmd", "qlm")


def add_commands(sub: Subparsers) -> None:
    """Add this package's subcommands; each sets `handler` (`qlm capacity`: capacity_cli.py)."""
    _add_simulate(sub)
    add_capacity(sub)


# --- qlm simulate ----------------------------------------------------------------------------


def _add_simulate(sub: Subparsers) -> None:
    p = sub.add_parser(
        "simulate",
        help="run policies over a scenario on the simulator; write CSV, JSON and a report",
        description="Simulate a scenario (sims/*.yaml) under each policy on identical requests.",
    )
    p.add_argument("scenario", type=Path, help="scenario YAML (see sims/README.md)")
    p.add_argument(
        "--policy",
        action="append",
        help=f"policy to run (repeat); default {', '.join(DEFAULT_POLICIES)}; an unknown name "
        "lists the known ones",
    )
    p.add_argument("--seed", type=int, help="seed (default: the scenario's)")
    p.add_argument("--out", type=Path, help="output folder (default sim-out/<scenario name>)")
    p.add_argument("--sweep", help="rate=F1,F2,...: run at each arrival-rate scale")
    p.add_argument("--quick", action="store_true", help="use the quick sibling file (X-quick.yaml)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="spread the runs over the Ray cluster at ADDRESS (default $RAY_ADDRESS; none: "
        "run here); the results are the same (qlm/sim/spread.py)",
    )
    p.set_defaults(handler=_simulate_command)


def _simulate_command(args: argparse.Namespace) -> int:
    from qlm.sim.bound import scenario_bound
    from qlm.sim.policies import SIM_POLICIES
    from qlm.sim.report import RunInfo, SweepPoint, sweep_document, write_json, write_sweep_report
    from qlm.sim.scenario import load_scenario, quick_sibling
    from qlm.sim.spread import make_runner, spread_policies

    scenario = load_scenario(quick_sibling(args.scenario, args.quick))
    policies = list(dict.fromkeys(args.policy or _default_policies()))
    for name in policies:
        SIM_POLICIES.get(name)  # unknown names fail before any run, listing the known ones
    seed = scenario.seed if args.seed is None else args.seed
    out: Path = args.out or Path("sim-out") / scenario.name
    command = _command_line(args)
    runner = make_runner(args.ray)

    def here(scenario: Scenario) -> list[SimResult]:  # in this process, with progress bars
        return run_policies(scenario, policies, seed, not args.no_progress)

    if args.sweep:
        scales = parse_sweep(args.sweep)
        points = []
        scaled_runs = spread_policies(
            runner, [scenario.with_rate_scale(s) for s in scales], policies, seed, here
        )
        for scale, (scaled, results) in zip(scales, scaled_runs, strict=True):
            folder = f"rate-{scale:g}"
            print(f"== rate x {scale:g}", flush=True)
            bound = scenario_bound(scaled, seed)
            write_outputs(out / folder, RunInfo(scenario, seed, command), results, bound)
            points.append(SweepPoint(scale, folder, tuple(results), bound))
        write_json(out / "sweep.json", sweep_document(scenario.name, seed, points))
        write_sweep_report(out, RunInfo(scenario, seed, command), points)
        print(f"wrote {out}/sweep.json and {out}/report.md")
        return 0
    [(_, results)] = spread_policies(runner, [scenario], policies, seed, here)
    bound = scenario_bound(scenario, seed)
    write_outputs(out, RunInfo(scenario, seed, command), results, bound)
    print(f"wrote {out}/requests.csv, {out}/summary.json, {out}/timings.json and {out}/report.md")
    return 0


def _default_policies() -> list[str]:
    from qlm.sim.policies import SIM_POLICIES

    known = set(SIM_POLICIES.names())
    return [p for p in DEFAULT_POLICIES if p in known]


def parse_sweep(text: str) -> list[float]:
    """'rate=0.5,1,2,4' -> [0.5, 1.0, 2.0, 4.0]."""
    name, sep, values = text.partition("=")
    if name.strip() != "rate" or not sep:
        raise ConfigError(f"--sweep: expected rate=F1,F2,..., got {text!r}")
    try:
        scales = [float(v) for v in values.split(",") if v.strip()]
    except ValueError as exc:
        raise ConfigError(f"--sweep: {exc}") from exc
    if not scales or any(not (s > 0 and math.isfinite(s)) for s in scales):
        raise ConfigError(f"--sweep: rate scales must be positive numbers, got {text!r}")
    return scales


def run_policies(
    scenario: Scenario, policies: Sequence[str], seed: int, progress: bool = True
) -> list[SimResult]:
    """Each policy on the same requests (the scenario's, drawn once with `seed`)."""
    from qlm.sim.simulate import SimConfig, SimulatedEngines, simulate

    requests = scenario.requests(seed)
    fleet = scenario.fleet()
    config = scenario.config
    options = SimConfig(max_time_s=scenario.horizon_s or math.inf)
    engines = SimulatedEngines(scenario.engine)
    results = []
    bar = progress and _is_terminal(sys.stderr)  # a bar in a log or CI output is noise
    for name in policies:
        with _Bar(name, len(requests), bar) as report:
            result = simulate(
                fleet,
                requests,
                name,
                config,
                seed,
                progress=report,
                options=options,
                engine_factory=engines,
            )
            results.append(result)
    return results


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


class _Bar:
    """A tqdm bar on stderr fed with (ended, total) from the runner."""

    def __init__(self, name: str, total: int, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=total, desc=f"{name:<12}", unit="req", file=sys.stderr, disable=not enabled
        )

    def __call__(self, ended: int, total: int) -> None:
        self.bar.update(ended - self.bar.n)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()


def write_outputs(
    out: Path, info: RunInfo, results: Sequence[SimResult], bound: AttainmentBound | None = None
) -> None:
    """requests.csv, summary.json (with the bound), timings.json and report.md (with its PNGs)
    in out; prints the table, the bound as its last row."""
    from qlm.sim.report import (
        summary_document,
        summary_table,
        timings_document,
        write_json,
        write_report,
        write_requests_csv,
    )
    from qlm.sim.report.bound_rows import add_bound_to_report, terminal_bound_row
    from qlm.sim.report.prefix import add_prefix_to_report, scenario_oracle_reuse

    name, seed = info.scenario.name, info.seed
    values = None if bound is None else bound.as_dict()
    out.mkdir(parents=True, exist_ok=True)
    write_requests_csv(out / "requests.csv", results)
    oracle = scenario_oracle_reuse(info.scenario, seed)
    write_json(out / "summary.json", summary_document(name, seed, results, values, oracle))
    write_json(out / "timings.json", timings_document(name, seed, results))
    report = write_report(out, info, results)
    add_prefix_to_report(report, results, oracle)
    table = summary_table(results)
    if bound is not None:
        add_bound_to_report(report, bound)
        table += "\n" + terminal_bound_row(table, bound)
    print(table, flush=True)


def _command_line(args: argparse.Namespace) -> str:
    """The simulate command as it was given (for the report)."""
    words = ["qlm", "simulate", str(args.scenario)]
    words += [f"--policy={p}" for p in args.policy or []]
    for flag, value in (("--seed", args.seed), ("--out", args.out), ("--sweep", args.sweep)):
        if value is not None:
            words.append(f"{flag}={value}")
    words += ["--quick"] if args.quick else []
    return " ".join(shlex.quote(w) for w in words)
