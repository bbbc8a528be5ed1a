"""The `qlm` command line. `qlm plan SNAPSHOT.yaml` runs the policy core once on the embedded
default: group the queued requests, estimate waits, plan with each policy, and print the
predicted SLO attainment per class."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from qlm.clock import WallClock
from qlm.config import ConfigError, load_yaml_model
from qlm.estimator import WaitEstimator, make_estimator
from qlm.grouping import make_grouping
from qlm.grouping.group import RequestGroup
from qlm.registry import UnknownPolicyError
from qlm.snapshot import Snapshot
from qlm.solver import PLANNERS, Plan, PlanInput, make_planner
from qlm.types import Fleet, Request

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qlm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_plan(sub)
    for module in _COMMAND_MODULES:
        importlib.import_module(module).add_commands(sub)
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (ConfigError, UnknownPolicyError) as exc:
        print(f"qlm: error: {exc}", file=sys.stderr)
        return 2


# Modules that add subcommands: each has add_commands(subparsers), and every parser it adds
# sets `handler` (a function of the parsed arguments returning the exit status).
_COMMAND_MODULES = (
    "qlm.sim.simulate_cli",
    "qlm.serve.serve_cli",
    "qlm.engine.profiling.profile_cli",
    "qlm.replay.replay_cli",
)


def _add_plan(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = sub.add_parser("plan", help="group, estimate and plan a queue snapshot once")
    plan.add_argument("snapshot", type=Path, help="snapshot YAML (see examples/plan.yaml)")
    plan.add_argument(
        "--policy", action="append", help=f"planner(s) to compare; known: {PLANNERS.names()}"
    )
    plan.add_argument("--backend", help="MILP backend: cpsat, pulp-cbc or pulp-highs")
    plan.add_argument("--time-limit", type=float, help="planner time limit in seconds")
    plan.set_defaults(
        handler=lambda a: _plan(
            a.snapshot, a.policy or ["fcfs", "edf", "milp"], a.backend, a.time_limit
        )
    )


def _plan(path: Path, policies: list[str], backend: str | None, limit: float | None) -> int:
    snapshot = load_yaml_model(path, Snapshot)
    config = snapshot.config
    requests = snapshot.queued_requests()
    fleet = snapshot.fleet()
    grouping = make_grouping(config.grouping)
    groups = grouping.regroup(requests, snapshot.now_s)
    print(
        f"{len(requests)} queued requests -> {len(groups)} groups "
        f"({config.grouping.policy}); {len(fleet.instances)} instances"
    )
    estimator = make_estimator(config.estimator, fleet)
    inp = PlanInput(
        groups,
        fleet,
        snapshot.now_s,
        busy_s=snapshot.busy_s_by_instance(),
        slo_classes=config.slo_class_map(),
    )
    by_id = {r.id: r for r in requests}
    classes = [c.name for c in config.slo_classes]
    print(_header(classes))
    for name in policies:
        overrides: dict[str, object] = {"policy": name}
        if backend:
            overrides["backend"] = backend
        if limit:
            overrides["time_limit_s"] = limit
        planner_config = config.planner.model_validate({**config.planner.model_dump(), **overrides})
        plan = make_planner(planner_config, estimator, WallClock()).plan(inp)
        met = predicted_attainment(
            plan, groups, fleet, estimator, snapshot.busy_s_by_instance(), by_id, snapshot.now_s
        )
        print(_row(name, plan, met, classes))
    return 0


def predicted_attainment(
    plan: Plan,
    groups: Sequence[RequestGroup],
    fleet: Fleet,
    estimator: WaitEstimator,
    busy_s: dict[str, float],
    requests: dict[str, Request],
    now_s: float,
) -> dict[str, tuple[int, int]]:
    """Per SLO class: (requests predicted to meet their TTFT deadline at the estimator's
    percentile, requests) under the plan."""
    by_id = {g.id: g for g in groups}
    met: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for inst_id, gids in plan.queues.items():
        est = estimator.estimate_queue(
            [by_id[g] for g in gids], fleet.instance(inst_id), busy_s.get(inst_id, 0.0)
        )
        for rid, ttft in zip(est.request_ids, est.ttft_p_s, strict=True):
            req = requests[rid]
            total[req.slo_class] += 1
            met[req.slo_class] += now_s + float(ttft) <= req.ttft_deadline_at_s
    for gid in plan.unplaced:
        for rid in by_id[gid].request_ids:
            total[requests[rid].slo_class] += 1
    return {c: (met[c], total[c]) for c in total}


def _header(classes: list[str]) -> str:
    cols = "".join(f"{c:>14}" for c in classes)
    return f"{'policy':<8}{'status':<11}{'solve_s':>8}{'swaps':>6}{'overall':>9}{cols}"


def _row(name: str, plan: Plan, met: dict[str, tuple[int, int]], classes: list[str]) -> str:
    done = sum(m for m, _ in met.values())
    total = sum(t for _, t in met.values())
    cells = "".join(f"{_share(*met.get(c, (0, 0))):>14}" for c in classes)
    return (
        f"{name:<8}{plan.status.value:<11}{plan.solve_wall_s:>8.3f}{plan.swaps:>6}"
        f"{_share(done, total):>9}{cells}"
    )


def _share(met: int, total: int) -> str:
    return "-" if total == 0 else f"{100.0 * met / total:.1f}%"


if __name__ == "__main__":
    raise SystemExit(main())
