"""`sim_quality.py --seeds 0,1,7 [--quick]`: every policy on WA, WB and WC at several seeds, one
docs block (sim-quality-seeds) with a table per seed and a verdict table.

A plain run (or `--seed N`) keeps one result per scenario and size, so a run at another seed
replaces it; this mode keeps each seed's results side by side in results/sim_quality_seeds.json
(a new --seeds run replaces the file).

The verdict, per scenario and seed, against the baselines fcfs, edf, shepherd and llmd (the
qlm-* ablations are in the tables, not in the verdict):

- overall: qlm's overall attainment >= every baseline's (margin: qlm minus the best baseline);
- classes: for every class, qlm's attainment within CLASS_SLACK_PTS points of the best
  baseline's for that class (margin: the worst class's qlm minus that class's best baseline);
- throughput: qlm's throughput >= THROUGHPUT_RATIO x the best baseline's (margin: the ratio).

The `bound` row is the scenario's clairvoyant upper bound on attainment at that seed
(qlm/sim/bound.py, `scenario_bound`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.report import (
    RESULTS_DIR,
    code_version,
    machine,
    platform_description,
    write_docs_block,
    write_results,
)
from benchmarks.sim_quality.checks import BASELINES, ordered
from benchmarks.sim_quality.render import (
    HEAD_AFTER_CLASSES,
    classes_of,
    policy_cells,
    row,
    timeout_note,
)
from benchmarks.sim_quality.runs import run_matrix, scenario_path
from qlm.sim.bound import scenario_bound
from qlm.sim.scenario import load_scenario
from qlm.sim.spread import Runner

RESULTS_PATH = RESULTS_DIR / "sim_quality_seeds.json"
DOCS_BLOCK = "sim-quality-seeds"
CLASS_SLACK_PTS = 2.0
THROUGHPUT_RATIO = 0.95


@dataclass(frozen=True)
class SeedsRun:
    """What to run: scenarios, policies, seeds, size, parallel jobs, a wall-time limit per run."""

    names: Sequence[str]
    policies: Sequence[str]
    seeds: Sequence[int]
    quick: bool
    jobs: int
    limit_s: float | None
    command: str
    runner: Runner | None = None  # a Ray cluster instead of local processes


def bound_of(name: str, quick: bool, seed: int) -> dict[str, Any]:
    """The clairvoyant bound of this scenario at this seed: overall and per class, and the
    counts behind it."""
    bound = scenario_bound(load_scenario(scenario_path(name, quick)), seed)
    return {
        **bound.as_dict(),
        "infeasible": bound.infeasible,
        "capacity_excluded": bound.capacity_excluded,
    }


def run(spec: SeedsRun) -> dict[str, Any]:
    """Run every policy on every scenario at every seed; the results document."""
    stamp = {"code": code_version(), "date": datetime.now(UTC).isoformat(timespec="seconds")}
    by_seed: dict[str, Any] = {}
    for seed in spec.seeds:
        print(f"seed {seed}", flush=True)
        scenarios = run_matrix(
            spec.names, spec.policies, spec.quick, seed, spec.jobs, spec.limit_s, spec.runner
        )
        for short, (name, entry) in zip(spec.names, scenarios.items(), strict=True):
            entry["run_seed"] = seed
            entry["bound"] = bound_of(short, spec.quick, seed)
            for summary in entry["policies"].values():
                summary.update(stamp)
            print(f"  {name:<9} bound         attainment {entry['bound']['overall']:6.1%}")
        by_seed[str(seed)] = scenarios
    return {
        "commands": [spec.command.strip()],
        "machine": f"{machine('shared and noisy; sim wall times are indicative')} "
        f"({platform_description()})",
        "size": "quick" if spec.quick else "full",
        "seeds": [int(s) for s in spec.seeds],
        "runs": by_seed,
    }


def _att(summary: dict[str, Any], cls: str) -> float | None:
    value = summary["slo_attainment"].get(cls)
    return None if value is None else float(value)


def verdict(entry: dict[str, Any]) -> dict[str, Any]:
    """The three checks for one scenario at one seed (None where qlm or a baseline is
    missing, e.g. stopped by --max-run-s)."""
    pol = entry["policies"]
    missing = [p for p in ("qlm", *BASELINES) if p not in pol]
    if missing:
        return {"missing": missing}
    q = pol["qlm"]
    bases = {b: pol[b] for b in BASELINES}
    best_overall = max(bases, key=lambda b: float(bases[b]["slo_attainment"]["overall"]))
    overall_margin = 100.0 * (
        float(q["slo_attainment"]["overall"])
        - float(bases[best_overall]["slo_attainment"]["overall"])
    )
    overall_ok = all(
        float(q["slo_attainment"]["overall"]) >= float(s["slo_attainment"]["overall"])
        for s in bases.values()
    )
    class_margins: dict[str, dict[str, Any]] = {}
    for cls in q["slo_attainment"]:
        if cls == "overall":
            continue
        found = {b: _att(s, cls) for b, s in bases.items()}
        present = {b: v for b, v in found.items() if v is not None}
        if not present:
            continue
        best = max(present, key=lambda b: present[b])
        class_margins[cls] = {
            "best": best,
            "margin_pts": 100.0 * (float(q["slo_attainment"][cls]) - present[best]),
        }
    worst_cls = min(class_margins, key=lambda c: class_margins[c]["margin_pts"], default=None)
    classes_ok = all(m["margin_pts"] >= -CLASS_SLACK_PTS for m in class_margins.values())
    best_thr = max(bases, key=lambda b: float(bases[b]["throughput_rps"]))
    thr_best = float(bases[best_thr]["throughput_rps"])
    ratio = float(q["throughput_rps"]) / thr_best if thr_best > 0 else None
    return {
        "overall_ok": overall_ok,
        "overall_margin_pts": overall_margin,
        "overall_best": best_overall,
        "classes_ok": classes_ok,
        "class_margins": class_margins,
        "worst_class": worst_cls,
        "throughput_ok": ratio is None or ratio >= THROUGHPUT_RATIO,
        "throughput_ratio": ratio,
        "throughput_best": best_thr,
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def seed_table(scenarios: dict[str, Any], classes: Sequence[str]) -> str:
    head = ["scenario", "requests", "policy", "overall", *classes, *HEAD_AFTER_CLASSES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, entry in scenarios.items():
        lead = [name, str(entry["requests"])]
        for policy, summary in ordered(entry["policies"]):
            lines.append(row([*lead, policy, *policy_cells(summary, tuple(classes))]))
        for policy, stop in entry.get("timeouts", {}).items():
            lines.append(row([*lead, policy, timeout_note(entry, stop)], len(head)))
        if "bound" in entry:
            b = entry["bound"]
            cells = [name, str(entry["requests"]), "bound", _pct(b["overall"])]
            cells += [_pct(b.get(c)) for c in classes]
            lines.append(row(cells, len(head)))
    return "\n".join(lines)


def miss_lines(scenarios: dict[str, Any]) -> list[str]:
    """qlm's missed requests by cause, per scenario (summary's miss_causes)."""
    out = []
    for name, entry in scenarios.items():
        qlm = entry["policies"].get("qlm")
        if qlm is None or qlm.get("miss_causes") is None:
            continue
        causes = sorted(((c, n) for c, n in qlm["miss_causes"].items() if n), key=lambda kv: -kv[1])
        text = ", ".join(f"{c} {n}" for c, n in causes) or "none missed"
        out.append(f"- {name}: {text}")
    return out


def verdict_table(doc: dict[str, Any]) -> str:
    head = ["scenario", "seed", "qlm overall >= every baseline", "margin (pts, vs best)"]
    head += [f"every class within {CLASS_SLACK_PTS:g} pts of best", "worst class margin (pts)"]
    head += [f"throughput >= {THROUGHPUT_RATIO:g}x best", "qlm / best throughput"]
    head += ["qlm overall vs bound (pts)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for seed, scenarios in doc["runs"].items():
        for name, entry in scenarios.items():
            v = verdict(entry)
            if "missing" in v:
                cells = [name, seed, f"- (not finished: {', '.join(v['missing'])})"]
                lines.append(row(cells, len(head)))
                continue
            worst = v["worst_class"]
            worst_text = (
                "-"
                if worst is None
                else f"{v['class_margins'][worst]['margin_pts']:+.1f} "
                f"({worst} vs {v['class_margins'][worst]['best']})"
            )
            q = float(entry["policies"]["qlm"]["slo_attainment"]["overall"])
            gap = "-" if "bound" not in entry else f"{100.0 * (q - entry['bound']['overall']):+.1f}"
            cells = [
                name,
                seed,
                "PASS" if v["overall_ok"] else "MISS",
                f"{v['overall_margin_pts']:+.1f} (vs {v['overall_best']})",
                "PASS" if v["classes_ok"] else "MISS",
                worst_text,
                "PASS" if v["throughput_ok"] else "MISS",
                "-"
                if v["throughput_ratio"] is None
                else f"{v['throughput_ratio']:.3f} (vs {v['throughput_best']})",
                gap,
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(doc: dict[str, Any]) -> str:
    """The docs block: header, one table per seed, qlm's miss causes, the verdict table."""
    runs = doc["runs"]
    every = {n: e for scenarios in runs.values() for n, e in scenarios.items()}
    classes = classes_of(every)
    stamps = [s for sc in runs.values() for e in sc.values() for s in e["policies"].values()]
    parts = [
        f"## Simulator quality: WA, WB and WC at seeds {', '.join(runs)} ({doc['size']} size)",
        "",
        "Every policy on each scenario at each seed (the seed draws the requests; the scenario "
        "files' own seed is 1). Attainment as in the block above; `bound` is the clairvoyant "
        "upper bound on attainment for those requests on that fleet (qlm/sim/bound.py). "
        "Verdict against the baselines fcfs, edf, shepherd and llmd (the qlm-* ablations are "
        f"not in it): qlm's overall attainment >= every baseline's; every class within "
        f"{CLASS_SLACK_PTS:g} points of the best baseline for that class; throughput >= "
        f"{THROUGHPUT_RATIO:g} x the best baseline's.",
        "",
        f"Commands: {'; '.join(f'`{c}`' for c in doc['commands'])}  ",
        f"Dates: {', '.join(sorted({s['date'][:10] for s in stamps}))}  ",
        f"Machine: {doc['machine']}  ",
        f"Code: {', '.join(sorted({s['code'] for s in stamps}))}",
        "",
    ]
    for seed, scenarios in runs.items():
        parts += [f"### Seed {seed}", "", seed_table(scenarios, classes), ""]
        misses = miss_lines(scenarios)
        if misses:
            parts += ["qlm's missed requests by cause (qlm/sim/miss_causes.py):", "", *misses, ""]
    parts += ["### Verdict", "", verdict_table(doc)]
    return "\n".join(parts)


def main(spec: SeedsRun, results_path: Path = RESULTS_PATH) -> None:
    """Run, write the results file and the docs block, print the block."""
    print(
        f"running {len(spec.names)} scenarios x {len(spec.policies)} policies at seeds "
        f"{', '.join(map(str, spec.seeds))}",
        flush=True,
    )
    doc = run(spec)
    for scenarios in doc["runs"].values():
        for entry in scenarios.values():
            entry["verdict"] = verdict(entry)
    write_results(results_path, doc)
    block = render(doc)
    write_docs_block(DOCS_BLOCK, block)
    print()
    print(block)
