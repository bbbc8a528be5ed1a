"""Subcommands of `qlm` (see qlm/cli.py): `simulate` and `capacity`.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from qlm.config import ConfigError

if TYPE_CHECKING:  # the heavy modules load when a command runs, not when `qlm` starts
    from qlm.sim.bound import AttainmentBound
    from qlm.sim.capacity import CapacityResult, Evaluation
    from qlm.sim.report import RunInfo
    from qlm.sim.result import SimResult
    from qlm.sim.scenario import Scenario

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


# Compared by default: the baselines and QLM (the ablations only when named).
DEFAULT_POLICIES = ("fcfs", "edf", "shepherd", "llmd", "qlm")


def add_commands(sub: Subparsers) -> None:
    """Add this package's subcommands; each sets `handler`."""
    _add_simulate(sub)
    _add_capacity(sub)


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
    from qlm.sim.scenario import load_scenario
    from qlm.sim.spread import make_runner, spread_policies

    scenario = load_scenario(_scenario_path(args.scenario, args.quick))
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


def _scenario_path(path: Path, quick: bool) -> Path:
    if not quick or path.stem.endswith("-quick"):
        return path
    sibling = path.with_name(f"{path.stem}-quick{path.suffix}")
    if not sibling.is_file():
        raise ConfigError(f"{path}: --quick needs {sibling}")
    return sibling


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
    from qlm.sim.runner import SimConfig, SimulatedEngines, simulate

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


# --- qlm capacity ----------------------------------------------------------------------------


def _add_capacity(sub: Subparsers) -> None:
    p = sub.add_parser(
        "capacity",
        help="find the cheapest fleet (instances per GPU type) meeting a target SLO attainment",
        description="Search instance counts per GPU type for the cheapest fleet whose simulated "
        "SLO attainment meets the target (qlm/sim/capacity.py explains the search).",
    )
    p.add_argument("scenario", type=Path, help="scenario YAML; its fleet groups are templates")
    p.add_argument("--target", type=float, default=0.99, help="attainment to meet (0-1]")
    p.add_argument("--policy", default="qlm", help="policy to plan for (default qlm)")
    p.add_argument("--gpu-types", help="types to size, e.g. A10,A100 (default: the fleet's)")
    p.add_argument("--cost", help="cost per GPU-hour, e.g. A10=1.0,A100=3.7 (default: scenario)")
    p.add_argument("--max-count", type=int, default=64, help="most instances per type (64)")
    p.add_argument(
        "--class", dest="slo_class", help="meet the target for this class (default: overall)"
    )
    p.add_argument("--seed", type=int, help="seed (default: the scenario's)")
    p.add_argument("--out", type=Path, help="JSON file (default sim-out/<name>-capacity.json)")
    p.add_argument("--quick", action="store_true", help="use the quick sibling file")
    p.set_defaults(handler=_capacity_command)


@dataclass(frozen=True)
class CapacityQuestion:
    scenario: Scenario
    gpu_types: tuple[str, ...]
    policy: str
    target: float
    max_count: int
    seed: int
    slo_class: str | None = None


def _capacity_command(args: argparse.Namespace) -> int:
    from qlm.sim.capacity import parse_costs
    from qlm.sim.policies import SIM_POLICIES
    from qlm.sim.report import write_json
    from qlm.sim.scenario import load_scenario

    scenario = load_scenario(_scenario_path(args.scenario, args.quick))
    SIM_POLICIES.get(args.policy)
    try:
        costs = parse_costs(args.cost, scenario.gpu_types)
        scenario = scenario.with_gpu_costs(costs)
        gpu_types = _gpu_types(args.gpu_types, scenario)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if args.slo_class is not None and args.slo_class not in {c.name for c in scenario.slo_classes}:
        raise ConfigError(f"--class: {args.slo_class!r} is not a class of the scenario")
    question = CapacityQuestion(
        scenario,
        gpu_types,
        args.policy,
        args.target,
        args.max_count,
        scenario.seed if args.seed is None else args.seed,
        args.slo_class,
    )
    result = plan_capacity(question, _print_evaluation)
    out: Path = args.out or Path("sim-out") / f"{scenario.name}-capacity.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, _capacity_document(question, result))
    if result.best is None:
        print(f"no fleet up to {args.max_count} per type meets {args.target:.2%}")
    else:
        print(f"cheapest: {_fleet_text(result.best)}")
    print(f"wrote {out}")
    return 0 if result.best is not None else 1


def _gpu_types(text: str | None, scenario: Scenario) -> tuple[str, ...]:
    if not text:
        return scenario.gpu_types
    chosen = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in chosen if t not in scenario.gpu_types]
    if unknown or not chosen:
        raise ValueError(
            f"--gpu-types: {unknown or text!r} not in the scenario's fleet "
            f"{list(scenario.gpu_types)} (add a group with count: 0 as a template)"
        )
    return chosen


def plan_capacity(
    question: CapacityQuestion, on_evaluation: Callable[[Evaluation], None] | None = None
) -> CapacityResult:
    """Simulate fleets chosen by the capacity search; the requests are drawn once."""
    from qlm.sim.capacity import Evaluation, SearchSpace, cheapest_fleet
    from qlm.sim.runner import SimConfig, SimulatedEngines, simulate

    scenario = question.scenario
    requests = scenario.requests(question.seed)
    config = scenario.config
    options = SimConfig(max_time_s=scenario.horizon_s or math.inf)
    costs: dict[tuple[int, ...], float] = {}

    def sized(counts: Mapping[str, int]) -> Scenario:
        return scenario.with_fleet_counts(counts)

    def cost(counts: Mapping[str, int]) -> float:
        key = tuple(counts[g] for g in question.gpu_types)
        if key not in costs:
            costs[key] = sized(counts).fleet_cost_per_hour()
        return costs[key]

    def attainment(counts: Mapping[str, int]) -> float:
        fleet = sized(counts).fleet()
        result = simulate(
            fleet,
            requests,
            question.policy,
            config,
            question.seed,
            options=options,
            engine_factory=SimulatedEngines(scenario.engine),
        )
        value = result.attainment(question.slo_class)
        if on_evaluation is not None:
            on_evaluation(Evaluation(counts, cost(counts), value, value >= question.target))
        return value

    space = SearchSpace(question.gpu_types, question.max_count, cost)
    return cheapest_fleet(space, attainment, question.target)


def _capacity_document(question: CapacityQuestion, result: CapacityResult) -> dict[str, object]:
    scenario = question.scenario
    return {
        "scenario": scenario.name,
        "seed": question.seed,
        "policy": question.policy,
        "metric": question.slo_class or "overall",
        "cost_per_gpu_hour": {g: scenario.gpu_cost_per_hour(g) for g in question.gpu_types},
        "fixed_counts": {
            g: n for g, n in scenario.fleet_counts().items() if g not in question.gpu_types
        },
        "max_count": question.max_count,
        **result.as_dict(),
    }


def _fleet_text(e: Evaluation) -> str:
    counts = " + ".join(f"{n} x {g}" for g, n in e.counts.items())
    return f"{counts}: {e.cost_per_hour:.2f}/h, attainment {e.attainment:.2%}"


def _print_evaluation(e: Evaluation, stream: TextIO | None = None) -> None:
    mark = "meets" if e.meets else "misses"
    print(f"evaluated {_fleet_text(e)} ({mark})", file=stream or sys.stdout, flush=True)
