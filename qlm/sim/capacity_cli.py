"""`qlm capacity`: the cheapest fleet (instances per GPU type) whose simulated SLO attainment
meets a target, for a scenario whose fleet groups are the templates.

    qlm capacity SCENARIO.yaml --target 0.99 [--policy qlm] [--gpu-types A10,A100]
                 [--cost A10=1.0,A100=3.7] [--max-count N] [--class NAME] [--seed N] [--out FILE]

The search itself is qlm/sim/capacity.py (pure: it asks for the attainment of the fleets it
picks); `plan_capacity` answers it by simulating each fleet on the same requests, drawn once.
Each fleet is picked from the previous answers, so locally the fleets are simulated one after
another; with `--ray ADDRESS` (or RAY_ADDRESS) every fleet of a column the search is about to
walk is simulated at once on the cluster (the search's prefetch hook), and the search reads
its answers from them: the same fleets evaluated, the same answer (tests/sim/test_spread.py),
in fewer rounds. Output format: qlm/sim/README.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from qlm.config import ConfigError

if TYPE_CHECKING:  # the heavy modules load when the command runs, not when `qlm` starts
    from qlm.sim.capacity import CapacityResult, Evaluation
    from qlm.sim.scenario import Scenario
    from qlm.sim.spread import Runner

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_capacity(sub: Subparsers) -> None:
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
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="simulate a column's fleets at once on this Ray cluster (default: $RAY_ADDRESS; "
        "neither: here, one after another)",
    )
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
    from qlm.sim.scenario import load_scenario, quick_sibling
    from qlm.sim.spread import make_runner

    scenario = load_scenario(quick_sibling(args.scenario, args.quick))
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
    result = plan_capacity(question, _print_evaluation, make_runner(args.ray))
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
    question: CapacityQuestion,
    on_evaluation: Callable[[Evaluation], None] | None = None,
    runner: Runner | None = None,
) -> CapacityResult:
    """Simulate fleets chosen by the capacity search; the requests are drawn once. With a
    runner other than the local one, each column's fleets are simulated at once on it."""
    from qlm.sim.capacity import Evaluation, SearchSpace, cheapest_fleet
    from qlm.sim.spread import FleetRun, LocalRunner, run_fleet

    scenario = question.scenario
    requests = tuple(scenario.requests(question.seed))
    costs: dict[tuple[int, ...], float] = {}
    done: dict[tuple[int, ...], float] = {}  # attainments simulated ahead (prefetch)

    def key(counts: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(counts[g] for g in question.gpu_types)

    def job(counts: Mapping[str, int]) -> FleetRun:
        sized = scenario.with_fleet_counts(counts)
        return FleetRun(sized, requests, question.policy, question.seed, question.slo_class)

    def cost(counts: Mapping[str, int]) -> float:
        if key(counts) not in costs:
            costs[key(counts)] = scenario.with_fleet_counts(counts).fleet_cost_per_hour()
        return costs[key(counts)]

    def attainment(counts: Mapping[str, int]) -> float:
        value = done.pop(key(counts), None)
        if value is None:
            value = run_fleet(job(counts))
        if on_evaluation is not None:
            on_evaluation(Evaluation(counts, cost(counts), value, value >= question.target))
        return value

    def prefetch(fleets: Sequence[Mapping[str, int]]) -> None:
        assert runner is not None
        todo = [c for c in fleets if key(c) not in done]
        done.update(zip(map(key, todo), runner.map(run_fleet, [job(c) for c in todo]), strict=True))

    space = SearchSpace(question.gpu_types, question.max_count, cost)
    parallel = runner is not None and not isinstance(runner, LocalRunner)
    return cheapest_fleet(space, attainment, question.target, prefetch if parallel else None)


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
