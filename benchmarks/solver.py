"""Planner benchmark: the MILP planner (CP-SAT, CBC, HiGHS) against EDF on heterogeneous
fleets, then the grouping benchmark. Prints Markdown, writes results/solver.json and the
solver block of docs/benchmarks.md.

    .venv/bin/python benchmarks/solver.py [--quick] [--repeats N]

Fleets: half A10 (24 GiB), the rest A100 (80 GiB; some with two GPUs) and a few H100.
Models: mistral-7b (fits everything), vicuna-13b (A100/H100 only), llama-70b (two A100s).
Groups: 10-250 requests, mixed SLO classes, deadlines from already late to well ahead.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks.*, tests.*

from benchmarks.report import (
    DOCS_PATH,
    RESULTS_DIR,
    ROOT,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.config import EstimatorConfig, PlannerBackend, PlannerConfig
from qlm.estimator.rwt import RwtEstimator
from qlm.grouping.group import RequestGroup
from qlm.perf.profile import Profile
from qlm.planner import Plan, PlanInput, make_planner
from qlm.types import DEFAULT_GPU_TYPES, DEFAULT_SLO_CLASSES, Fleet, Instance

RESULTS_PATH = RESULTS_DIR / "solver.json"
DOCS_BLOCK = "solver"
MACHINE_NOTE = "noisy; compare ratios within one run"
TARGETS = (
    "100 x 16 in <= 1 s at the median with objective no worse than EDF; 200 x 32 honours a "
    "2 s limit; grouping 100,000 requests <= 1 s; incremental insert <= 50 us"
)

BACKENDS: tuple[PlannerBackend, ...] = ("cpsat", "pulp-cbc", "pulp-highs")
BATCH_SIZES = (1, 16, 64, 128)
GB = 10**9
NOW_S = 10_000.0
SLO_SHARES = (0.4, 0.3, 0.3)  # interactive, batch-1, batch-2
GROUPING_TARGET_REQUESTS = 100_000
REL_TOL = 1e-9


@dataclass(frozen=True)
class Case:
    groups: int
    instances: int
    time_limit_s: float

    @property
    def label(self) -> str:
        return f"{self.groups} x {self.instances}"


CASES = (Case(20, 4, 0.8), Case(50, 8, 0.8), Case(100, 16, 0.8), Case(200, 32, 2.0))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    weight_gb: float
    kv_kib_per_token: float
    gpu_count: int
    share: float


MODELS = (
    ModelSpec("mistral-7b", 14.5, 128.0, 1, 0.55),
    ModelSpec("vicuna-13b", 26.0, 800.0, 1, 0.30),
    ModelSpec("llama-70b", 138.0, 320.0, 2, 0.15),
)

# (model, GPU type) -> (decode step s at BATCH_SIZES, prefill tokens/s, load s)
PERF: dict[tuple[str, str], tuple[tuple[float, ...], float, float]] = {
    ("mistral-7b", "A10"): ((0.025, 0.028, 0.040, 0.058), 5_000.0, 30.0),
    ("mistral-7b", "A100"): ((0.015, 0.017, 0.022, 0.030), 15_000.0, 20.0),
    ("mistral-7b", "H100"): ((0.015, 0.016, 0.018, 0.024), 20_000.0, 15.0),
    ("vicuna-13b", "A100"): ((0.022, 0.025, 0.034, 0.048), 9_000.0, 40.0),
    ("vicuna-13b", "H100"): ((0.017, 0.019, 0.025, 0.034), 14_000.0, 30.0),
    ("llama-70b", "A100"): ((0.045, 0.049, 0.052, 0.060), 6_000.0, 100.0),
}


# --- inputs ---------------------------------------------------------------------------------


def make_profiles() -> list[Profile]:
    specs = {m.name: m for m in MODELS}
    return [
        Profile(
            model=model,
            gpu_type=gpu,
            gpu_count=specs[model].gpu_count,
            weight_bytes=int(specs[model].weight_gb * GB),
            kv_bytes_per_token=int(specs[model].kv_kib_per_token * 1024),
            decode_batch_sizes=BATCH_SIZES,
            decode_step_s=steps,
            prefill_tokens_per_s=prefill,
            output_tokens_mean=211.0,
            output_tokens_std=200.0,
            load_s=load_s,
            max_batch_size=128,
            provenance="benchmarks/solver.py (synthetic, from shared/data/README.md figures)",
        )
        for (model, gpu), (steps, prefill, load_s) in PERF.items()
    ]


def make_instances(n: int, rng: np.random.Generator) -> list[Instance]:
    """n // 2 A10; max(1, n // 8) A100 x2 (llama-70b); n // 8 H100; the rest A100."""
    big = max(1, n // 8)
    h100 = n // 8
    kinds = ["A10"] * (n // 2) + ["A100x2"] * big + ["H100"] * h100
    kinds += ["A100"] * (n - len(kinds))
    return [_instance(f"{kind.lower()}-{i}", kind, rng) for i, kind in enumerate(kinds)]


def _instance(instance_id: str, kind: str, rng: np.random.Generator) -> Instance:
    gpu, count = ("A100", 2) if kind == "A100x2" else (kind, 1)
    if kind == "A100x2":
        loaded: str | None = "llama-70b"
    elif kind == "A10":
        loaded = "mistral-7b" if rng.random() < 0.8 else None
    else:
        loaded = str(rng.choice(["mistral-7b", "vicuna-13b"]))
    return Instance(instance_id, gpu, count, DEFAULT_GPU_TYPES[gpu].memory_bytes, loaded)


def make_groups(n: int, rng: np.random.Generator) -> list[RequestGroup]:
    models = rng.choice(len(MODELS), size=n, p=[m.share for m in MODELS])
    classes = rng.choice(len(DEFAULT_SLO_CLASSES), size=n, p=SLO_SHARES)
    return [
        _group(f"g{i}", MODELS[int(m)].name, int(c), rng)
        for i, (m, c) in enumerate(zip(models, classes, strict=True))
    ]


def _group(group_id: str, model: str, slo_index: int, rng: np.random.Generator) -> RequestGroup:
    slo = DEFAULT_SLO_CLASSES[slo_index]
    size = int(rng.integers(10, 251))
    slack_s = float(rng.uniform(-0.1, 1.0)) * slo.ttft_s  # negative: already late
    deadline_s = NOW_S + slack_s
    return RequestGroup(
        id=group_id,
        model=model,
        slo_class=slo.name,
        request_ids=tuple(f"{group_id}.{k}" for k in range(size)),
        prompt_tokens_mean=float(np.clip(rng.lognormal(np.log(1000), 0.6), 100, 6000)),
        output_cap_mean=float(rng.uniform(128, 1024)),
        ttft_deadline_at_s=deadline_s,
        completion_deadline_at_s=None,
        first_arrival_at_s=deadline_s - slo.ttft_s,
    )


def make_input(case: Case, seed: int) -> PlanInput:
    rng = np.random.default_rng([case.groups, case.instances, seed])
    instances = make_instances(case.instances, rng)
    fleet = Fleet.of(instances, make_profiles())
    busy = {inst.id: float(rng.uniform(0.0, 15.0)) for inst in instances}
    return PlanInput(tuple(make_groups(case.groups, rng)), fleet, NOW_S, busy_s=busy)


# --- runs -----------------------------------------------------------------------------------


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


# --- summaries ------------------------------------------------------------------------------


def summarise(runs: Sequence[dict[str, Any]], case: Case, planner: str) -> dict[str, Any]:
    mine = [r for r in runs if r["case"] == case.label and r["planner"] == planner]
    ok = [r for r in mine if r["status"] != "error"]
    walls = [r["wall_s"] for r in mine]
    ratios = [r["ratio_vs_edf"] for r in ok if r.get("ratio_vs_edf") is not None]
    return {
        "case": case.label,
        "planner": planner,
        "time_limit_s": None if planner == "edf" else case.time_limit_s,
        "runs": len(mine),
        "wall_s_median": statistics.median(walls),
        "wall_s_max": max(walls),
        "solve_wall_s_median": _median([r["solve_wall_s"] for r in ok]),
        "ratio_median": _median(ratios),
        "ratio_max": max(ratios) if ratios else None,
        "no_worse_than_edf": sum(r <= 1 + REL_TOL for r in ratios) if ratios else None,
        "better_than_edf": sum(r < 1 - 1e-6 for r in ratios) if ratios else None,
        "statuses": dict(Counter(r["status"] for r in mine)),
        "swaps_median": _median([r["swaps"] for r in ok]),
        "late_groups_median": _median([r["late_groups"] for r in ok]),
        "baseline_mismatches": sum(_baseline_mismatch(r) for r in ok),
    }


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _baseline_mismatch(run: dict[str, Any]) -> bool:
    """The MILP's own EDF objective should equal the EDF planner's on the same input."""
    own, edf = run.get("baseline_objective"), run.get("edf_objective")
    if own is None or edf is None:
        return False
    return bool(abs(own - edf) > REL_TOL * max(1.0, abs(edf)))


def evaluate_targets(
    summaries: Sequence[dict[str, Any]], grouping: list[dict[str, Any]] | str
) -> list[dict[str, str]]:
    rows = [_target_100x16(summaries, b) for b in BACKENDS]
    rows += [_target_200x32(summaries, b) for b in BACKENDS]
    if isinstance(grouping, str):
        return [*rows, _row("grouping", "-", grouping, None)]
    for row in grouping:
        rows += _grouping_targets(row)
    return rows


def _find(summaries: Sequence[dict[str, Any]], case: str, planner: str) -> dict[str, Any] | None:
    return next((s for s in summaries if s["case"] == case and s["planner"] == planner), None)


def _row(target: str, subject: str, measured: str, ok: bool | None) -> dict[str, str]:
    result = "not run" if ok is None else ("PASS" if ok else "MISS")
    return {"target": target, "subject": subject, "measured": measured, "result": result}


def _target_100x16(summaries: Sequence[dict[str, Any]], backend: str) -> dict[str, str]:
    target = "100 x 16: median <= 1 s, objective <= EDF"
    s = _find(summaries, "100 x 16", f"milp/{backend}")
    if s is None:
        return _row(target, backend, "-", None)
    errors = s["statuses"].get("error", 0)
    ok = s["wall_s_median"] <= 1.0 and s["no_worse_than_edf"] == s["runs"] and not errors
    measured = (
        f"median {s['wall_s_median']:.3f} s; no worse than EDF {s['no_worse_than_edf']}/{s['runs']}"
    )
    return _row(target, backend, measured, ok)


def _target_200x32(summaries: Sequence[dict[str, Any]], backend: str) -> dict[str, str]:
    target = "200 x 32 honours a 2 s limit"
    s = _find(summaries, "200 x 32", f"milp/{backend}")
    if s is None:
        return _row(target, backend, "-", None)
    ok = s["wall_s_max"] <= 2.0 and not s["statuses"].get("error", 0)
    return _row(target, backend, f"max {s['wall_s_max']:.3f} s", ok)


def _grouping_targets(row: dict[str, Any]) -> list[dict[str, str]]:
    policy, n = str(row["policy"]), int(row["num_requests"])
    full = n >= GROUPING_TARGET_REQUESTS
    regroup = f"median {row['regroup_s_median']:.3f} s for {n:,} requests"
    add = f"median {row['add_us_median']:.1f} us, p99 {row['add_us_p99']:.1f} us"
    return [
        _row(
            "grouping 100,000 requests <= 1 s",
            policy,
            regroup,
            row["regroup_s_median"] <= 1.0 if full else None,
        ),
        _row("incremental insert <= 50 us", policy, add, row["add_us_median"] <= 50.0),
    ]


# --- grouping -------------------------------------------------------------------------------


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


# --- output ---------------------------------------------------------------------------------


def _fmt(value: object, column: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and column.startswith("ratio"):
        return f"{value:.4f}"  # 0.99995 is an improvement, not "1"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in sorted(value.items()))
    return str(value)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c), c) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


PLANNER_COLUMNS = (
    "case", "planner", "time_limit_s", "runs", "wall_s_median", "wall_s_max",
    "solve_wall_s_median", "ratio_median", "ratio_max", "no_worse_than_edf", "better_than_edf",
    "statuses", "swaps_median", "late_groups_median",
)  # fmt: skip
GROUPING_COLUMNS = (
    "policy", "num_requests", "num_groups", "regroup_s_median", "regroup_s_max",
    "add_us_median", "add_us_p99", "max_group_size",
)  # fmt: skip


def render(report: dict[str, Any]) -> str:
    grouping = report["grouping"]
    parts = [
        "## Planner and grouping benchmark",
        "",
        *header_lines(report),
        "",
        f"Targets: {TARGETS}.",
        "",
        markdown_table(report["targets"], ("target", "subject", "measured", "result")),
        "",
        "### Planner: MILP backends against EDF",
        "",
        "wall_s: measured around `plan()` (perf_counter); solve_wall_s: `Plan.solve_wall_s`; "
        "ratio: MILP objective / EDF objective on the same input (lower is better, <= 1 is "
        "no worse); statuses count runs; swaps and late groups are medians per plan. "
        f"Planner config otherwise default ({report['planner_defaults']}).",
        "",
        markdown_table(report["summaries"], PLANNER_COLUMNS),
        "",
        "### Grouping",
        "",
        grouping if isinstance(grouping, str) else markdown_table(grouping, GROUPING_COLUMNS),
    ]
    return "\n".join(parts)


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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


if __name__ == "__main__":
    main(sys.argv[1:])
