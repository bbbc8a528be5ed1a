"""Each planner on each input: EDF, then the MILP planner on every backend with the case's time
limit, its wall time and objective against EDF's; and the grouping benchmark's rows."""

from __future__ import annotations

import importlib
import sys
import time
from typing import Any

from benchmarks.solver.inputs import Case, make_input
from qlm.config import EstimatorConfig, PlannerBackend, PlannerConfig
from qlm.estimator.rwt import RwtEstimator
from qlm.solver import Plan, PlanInput, make_planner

BACKENDS: tuple[PlannerBackend, ...] = ("cpsat", "pulp-cbc", "pulp-highs")


def run_planner(config: PlannerConfig, inp: PlanInput) -> dict[str, Any]:
    planner = make_planner(config, RwtEstimator(EstimatorConfig(), inp.fleet))
    started = time.perf_counter()
    try:
        plan = planner.plan(inp)
    except Exception as exc:  # a planner bug must not stop the benchmark; it is reported
        return {"status": "error", "detail": repr(exc), "wall_s": time.perf_counter() - started}
    return _record(plan, time.perf_counter() - started)


def _record(plan: Plan, wall_s: float) -> dict[str, Any]:
    return {
        "status": str(plan.status),
        "wall_s": wall_s,
        "solve_wall_s": plan.solve_wall_s,
        "objective": plan.objective,
        "baseline_objective": plan.baseline_objective,
        "swaps": plan.swaps,
        "late_groups": len(plan.late_groups),
        "unplaced": len(plan.unplaced),
        "detail": plan.detail,
    }


def run_case(case: Case, repeats: int) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for seed in range(repeats):
        inp = make_input(case, seed)
        edf = run_planner(PlannerConfig(policy="edf"), inp)
        runs.append({"case": case.label, "planner": "edf", "seed": seed, **edf})
        for backend in BACKENDS:
            config = PlannerConfig(backend=backend, time_limit_s=case.time_limit_s)
            milp = run_planner(config, inp)
            ratio = _ratio(milp.get("objective"), edf.get("objective"))
            row = {"case": case.label, "planner": f"milp/{backend}", "seed": seed, **milp}
            runs.append({**row, "edf_objective": edf.get("objective"), "ratio_vs_edf": ratio})
            print(f"  {case.label} seed {seed} {backend}: {_brief(milp, ratio)}", file=sys.stderr)
    return runs


def _ratio(objective: float | None, edf_objective: float | None) -> float | None:
    if objective is None or not edf_objective:
        return None
    return objective / edf_objective


def _brief(run: dict[str, Any], ratio: float | None) -> str:
    ratio_text = "n/a" if ratio is None else f"{ratio:.4f}"
    return f"{run['status']} {run['wall_s']:.3f}s ratio {ratio_text} {run.get('detail', '')}"


def warm_up() -> None:
    """Import and exercise each backend once so that first-call costs are not measured."""
    inp = make_input(Case(10, 4, 0.5), seed=999)
    for backend in BACKENDS:
        run_planner(PlannerConfig(backend=backend, time_limit_s=0.5), inp)


def run_grouping(num_requests: int) -> list[dict[str, Any]] | str:
    """The grouping benchmark's rows, or a message saying why it could not run."""
    module = None
    for name in ("benchmarks.grouping", "grouping"):
        try:
            module = importlib.import_module(name)
            break
        except ModuleNotFoundError as exc:
            if exc.name not in ("benchmarks", name):
                return f"grouping benchmark failed to import: {exc!r}"
        except ImportError as exc:
            return f"grouping benchmark failed to import: {exc!r}"
    if module is None:
        return "grouping benchmark not available (benchmarks/grouping.py is missing)"
    rows: list[dict[str, Any]] = module.run(num_requests=num_requests, seed=0)
    return rows
