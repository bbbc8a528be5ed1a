"""`sim_quality.py --random N` (with `--many`: the many-model family): every policy on N
random scenarios (qlm/sim/fuzz, seeds base..base+N-1, the quick size; with --many,
qlm/sim/fuzz/many_models.py's `many:SEED`), to see how qlm does on workloads it was never
tuned to. Each family (`FAMILIES`) has its own results file, docs block and baselines (the
many-model family adds the swapping serverless and logos).

qlm's margin on a scenario is its overall attainment minus the best baseline's (fcfs, edf,
shepherd, llmd), in points. The run prints and writes to docs/benchmarks.md (block
sim-quality-random) a table per scenario, the distribution of the margin and the worst cases;
results/sim_quality_random.json keeps the last run (a new run replaces it).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import (
    RESULTS_DIR,
    code_version,
    machine,
    platform_description,
    write_docs_block,
    write_results,
)
from benchmarks.sim_quality.checks import BASELINES, ordered
from benchmarks.sim_quality.runs import SIMS, Task, run_tasks
from qlm.sim.bound import scenario_bound
from qlm.sim.fuzz import RANDOM_PREFIX, FuzzDraw, draw_scenario
from qlm.sim.fuzz.many_models import MANY_PREFIX, draw_many_models
from qlm.sim.scenario import Scenario, load_scenario, random_scenario
from qlm.sim.spread import Runner

RESULTS_PATH = RESULTS_DIR / "sim_quality_random.json"
DOCS_BLOCK = "sim-quality-random"
CLOSE_PTS = -1.0  # a margin at or above this counts as "not beaten"
BAD_PTS = -5.0  # a margin below this is a clear loss
WORST_SHOWN = 5


@dataclass(frozen=True)
class RandomRun:
    """What to run: seeds, policies, parallel jobs, a wall-time limit per run, or a Ray
    cluster instead of local processes."""

    seeds: range
    policies: Sequence[str]
    jobs: int
    limit_s: float | None
    command: str
    runner: Runner | None = None
    family: str = "random"  # FAMILIES


@dataclass(frozen=True)
class Family:
    """A family of generated scenarios: its name prefix, how a seed's scenario is described,
    where its results and docs block go, the baselines qlm's margin is taken over, and the
    block's heading and introduction."""

    prefix: str
    describe: Callable[[int], dict[str, Any]]
    results: Path
    block: str
    baselines: tuple[str, ...]
    heading: str
    intro: str
    shipped: tuple[tuple[str, tuple[int, ...]], ...] = ()  # sims/<name>.yaml at these seeds


def describe(seed: int) -> dict[str, Any]:
    """The scenario of this seed as the results file records it."""
    draw = draw_scenario(seed)
    scenario = random_scenario(seed)
    return {
        "seed": seed,
        "description": draw.summary(streams=False),
        "streams": scenario.description,
        **_sizing(draw, scenario),
    }


def _sizing(draw: FuzzDraw, scenario: Scenario) -> dict[str, Any]:
    """What the results file records of a drawn scenario besides its words."""
    fleet = scenario.fleet()
    return {
        "load_factor": round(draw.load_factor, 3),
        "capacity_per_s": round(draw.capacity_per_s, 3),
        "window_s": draw.window_s,
        "requests": sum(1 for _ in scenario.iter_requests()),
        "instances": len(fleet.instances),
        "gpus": sum(i.gpu_count for i in fleet.instances),
        "bound_pct": bound_pct(scenario, scenario.seed),
        "policies": {},
        "timeouts": {},
    }


def bound_pct(scenario: Scenario, seed: int) -> float:
    """The clairvoyant upper bound on overall attainment at this seed (qlm/sim/bound.py), in
    percent. It lets each model use every instance able to hold it at once, each loaded at
    most once (from the start) and never swapped: on many models it is far above what any
    schedule that must take turns on an instance can reach. Computed here, in the calling
    process, before the runs (seconds per scenario: 7 s for sims/many-quick.yaml)."""
    return round(100.0 * scenario_bound(scenario, seed).overall, 2)


def describe_many(seed: int) -> dict[str, Any]:
    """The many-model scenario of this seed as the results file records it."""
    draw = draw_many_models(seed)
    scenario = Scenario.model_validate(draw.document)
    fleet = scenario.fleet()
    gpus = " + ".join(f"{i.gpu_count}x{i.gpu_type}" for i in fleet.instances)
    return {
        "seed": seed,
        "description": f"{draw.document['description']} ({gpus})",
        "streams": f"{len(scenario.workload)} per-model streams",
        **_sizing(draw, scenario),
    }


def describe_shipped(name: str, seed: int) -> dict[str, Any]:
    """A shipped scenario file of the family at a seed, as the results file records it."""
    scenario = load_scenario(SIMS / f"{name}.yaml")
    fleet = scenario.fleet()
    return {
        "seed": seed,
        "description": f"sims/{name}.yaml ({len(scenario.models)} models on "
        f"{len(fleet.instances)} instances, standby tier {scenario.engine.standby_models})",
        "streams": f"{len(scenario.workload)} per-model streams",
        "requests": len(scenario.requests(seed)),
        "instances": len(fleet.instances),
        "gpus": sum(i.gpu_count for i in fleet.instances),
        "bound_pct": bound_pct(scenario, seed),
        "policies": {},
        "timeouts": {},
    }


FAMILIES: dict[str, Family] = {
    "random": Family(
        RANDOM_PREFIX,
        describe,
        RESULTS_PATH,
        DOCS_BLOCK,
        BASELINES,
        "## Simulator quality: policies on random scenarios",
        "Every policy on random scenarios drawn by qlm/sim/fuzz (the quick size: 2-8 instances, "
        "1-3 models, 60-200 s of arrivals, at most ~3,000 requests, load 0.5-1.5 x the fleet's "
        "estimated capacity; qlm/sim/fuzz/throughput.py states the estimate's error). qlm's "
        "margin: its overall attainment minus the best of fcfs, edf, shepherd and llmd, in points. "
        "`qlm simulate random:SEED` reruns one scenario.",
    ),
    "many": Family(
        MANY_PREFIX,
        describe_many,
        RESULTS_DIR / "sim_quality_many.json",
        "sim-quality-many",
        (*BASELINES, "serverless", "logos"),
        "## Simulator quality: many models, few GPUs",
        "Every policy on many-model scenarios drawn by qlm/sim/fuzz/many_models.py (4-8 "
        "instances, 2-4x as many models, each a copy of a packaged 7B/13B/70B profile that must "
        "be loaded; Zipf popularity, per-model streams, standby tiers of 0-2; load 0.3-0.8 of "
        "what the best fractional placement serves, which pays no load time). qlm's margin: its "
        "overall attainment minus the best of fcfs, edf, shepherd, llmd and the swapping "
        "baselines serverless and logos, in points. `qlm simulate many:SEED` reruns one. "
        "The shipped sims/many-quick.yaml comes first, at seeds 0, 1 and 7 "
        "(`qlm simulate sims/many-quick.yaml --seed SEED`).",
        (("many-quick", (0, 1, 7)),),
    ),
}


def run(spec: RandomRun) -> dict[str, Any]:
    """Run every policy on every seed's scenario; the results document."""
    family = FAMILIES[spec.family]
    shipped = [(f"{name}@{seed}", name, seed) for name, seeds in family.shipped for seed in seeds]
    scenarios = {key: describe_shipped(name, seed) for key, name, seed in shipped}
    tasks = [
        Task((key, p), str(SIMS / f"{name}.yaml"), p, seed=seed)
        for key, name, seed in shipped
        for p in spec.policies
    ]
    drawn = {f"{family.prefix}{seed}": family.describe(seed) for seed in spec.seeds}
    scenarios |= drawn
    tasks += [Task((name, p), name, p) for name in drawn for p in spec.policies]
    stamp = {"code": code_version(), "date": datetime.now(UTC).isoformat(timespec="seconds")}
    for task, summary, waited_s in run_tasks(tasks, None, spec.jobs, spec.limit_s, spec.runner):
        name, policy = task.key
        if "stopped_after_s" in summary:
            scenarios[name]["timeouts"][policy] = {
                "after_s": round(waited_s),
                "ended": summary["ended"],
            }
            print(f"  {name:<10} {policy:<13} stopped after {waited_s:.0f} s", flush=True)
            continue
        scenarios[name]["policies"][policy] = {**summary, **stamp}
        print(
            f"  {name:<10} {policy:<13} attainment {summary['slo_attainment']['overall']:6.1%}  "
            f"wall {summary['sim_wall_s']:6.1f} s",
            flush=True,
        )
    for entry in scenarios.values():
        entry["qlm_margin_pts"] = margin_pts(entry["policies"], family.baselines)
    return {
        "family": spec.family,
        "commands": [spec.command.strip()],
        "machine": f"{machine('shared and noisy')} ({platform_description()})",
        "size": "quick",
        "scenarios": scenarios,
    }


def margin_pts(policies: dict[str, Any], baselines: Sequence[str] = BASELINES) -> float | None:
    """qlm's overall attainment minus the best baseline's, in points (None without both)."""
    base = [overall(policies[b]) for b in baselines if b in policies]
    if "qlm" not in policies or not base:
        return None
    return 100.0 * (overall(policies["qlm"]) - max(base))


def overall(summary: dict[str, Any]) -> float:
    return float(summary["slo_attainment"]["overall"])


def best_baseline(policies: dict[str, Any], baselines: Sequence[str] = BASELINES) -> str:
    present = [b for b in baselines if b in policies]
    return max(present, key=lambda b: overall(policies[b])) if present else "-"


def distribution(margins: Sequence[float]) -> dict[str, Any]:
    """min, p5 and median (numpy's linear interpolation), the share at or above CLOSE_PTS
    and the count below BAD_PTS."""
    values = np.asarray(margins, dtype=np.float64)
    if not len(values):
        return {"scenarios": 0}
    return {
        "scenarios": len(values),
        "min_pts": float(values.min()),
        "p5_pts": float(np.percentile(values, 5)),
        "median_pts": float(np.median(values)),
        "share_at_least_-1_pt": float((values >= CLOSE_PTS).mean()),
        "count_below_-5_pts": int((values < BAD_PTS).sum()),
    }


def scenario_table(
    scenarios: dict[str, Any], policies: Sequence[str], baselines: Sequence[str] = BASELINES
) -> str:
    head = ["seed", "scenario", "requests", *policies, "bound", "qlm margin (pts)", "best baseline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for entry in scenarios.values():
        pol = entry["policies"]
        cells = [str(entry["seed"]), entry["description"], str(entry["requests"])]
        for p in policies:
            cells.append(
                f"{overall(pol[p]):.1%}"
                if p in pol
                else "stopped"
                if p in entry["timeouts"]
                else "-"
            )
        bound = entry.get("bound_pct")  # results written before the bound was kept have none
        cells.append("-" if bound is None else f"{bound:.1f}%")
        m = entry.get("qlm_margin_pts")
        cells += ["-" if m is None else f"{m:+.1f}", best_baseline(pol, baselines)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(doc: dict[str, Any]) -> str:
    """The docs block: header, per-scenario table, margin distribution, worst cases."""
    family = FAMILIES[doc.get("family", "random")]
    scenarios = doc["scenarios"]
    seen = {p for e in scenarios.values() for p in e["policies"]} | {
        p for e in scenarios.values() for p in e["timeouts"]
    }
    policies = [p for p, _ in ordered(dict.fromkeys(seen, None))]
    stamps = [s for e in scenarios.values() for s in e["policies"].values()]
    margins = [e["qlm_margin_pts"] for e in scenarios.values() if e["qlm_margin_pts"] is not None]
    dist = distribution(margins)
    parts = [
        family.heading,
        "",
        family.intro,
        "",
        f"Commands: {'; '.join(f'`{c}`' for c in doc['commands'])}  ",
        f"Dates: {', '.join(sorted({s['date'][:10] for s in stamps}))}  ",
        f"Machine: {doc['machine']}  ",
        f"Code: {', '.join(sorted({s['code'] for s in stamps}))}",
        "",
        scenario_table(scenarios, policies, family.baselines),
        "",
        distribution_line(dist),
        *bound_gap_lines(scenarios),
        *qlm_cost_lines(scenarios),
        "",
        "Worst cases (lowest margins):",
        "",
    ]
    worst = sorted(
        (e for e in scenarios.values() if e["qlm_margin_pts"] is not None),
        key=lambda e: e["qlm_margin_pts"],
    )[:WORST_SHOWN]
    parts += [
        f"- seed {e['seed']}: {e['qlm_margin_pts']:+.1f} pts vs "
        f"{best_baseline(e['policies'], family.baselines)}; "
        f"{e['description']}; streams: {e['streams']}"
        for e in worst
    ] or ["- none"]
    return "\n".join(parts)


def qlm_cost_lines(scenarios: dict[str, Any]) -> list[str]:
    """qlm's planner wall time per request and its whole run's wall time, worst scenario and
    median (one process per run; wall time on a shared machine, so an upper bound of CPU)."""
    runs = [  # results written before the planner's time was kept have none
        (e["policies"]["qlm"], name)
        for name, e in scenarios.items()
        if "planner_wall_s" in e["policies"].get("qlm", {})
    ]
    if not runs:
        return []
    per_request = sorted(
        (1000 * r["planner_wall_s"] / max(1, r["requests"]), r["sim_wall_s"], name)
        for r, name in runs
    )
    worst = per_request[-1]
    median_ms = statistics.median(p[0] for p in per_request)
    longest = max(per_request, key=lambda p: p[1])
    return [
        "",
        f"qlm's planner: median {median_ms:.1f} ms of wall time per request over "
        f"{len(per_request)} scenarios, at most {worst[0]:.1f} ms ({worst[2]}); its longest "
        f"run took {longest[1]:.1f} s ({longest[2]}).",
    ]


def bound_gap_lines(scenarios: dict[str, Any]) -> list[str]:
    """How far qlm's overall attainment is below the clairvoyant bound: mean and worst over
    the scenarios that have both (the bound column, `bound_pct`)."""
    gaps = sorted(
        (e["bound_pct"] - 100.0 * overall(e["policies"]["qlm"]), name)
        for name, e in scenarios.items()
        if "bound_pct" in e and "qlm" in e["policies"]
    )
    if not gaps:
        return []
    mean_pts = statistics.fmean(g for g, _ in gaps)
    return [
        "",
        f"qlm below the clairvoyant bound (`bound`: qlm/sim/bound.py, each model on every "
        f"instance able to hold it at once, loaded at most once, no swaps): mean "
        f"{mean_pts:.1f} pts over "
        f"{len(gaps)} scenarios, at most {gaps[-1][0]:.1f} ({gaps[-1][1]}), at least "
        f"{gaps[0][0]:.1f} ({gaps[0][1]}).",
    ]


def distribution_line(dist: dict[str, Any]) -> str:
    if not dist["scenarios"]:
        return "qlm's margin: no scenario with qlm and a baseline."
    return (
        f"qlm's margin over the best baseline on {dist['scenarios']} scenarios: "
        f"min {dist['min_pts']:+.1f} pts, p5 {dist['p5_pts']:+.1f}, "
        f"median {dist['median_pts']:+.1f}; >= -1 pt on {dist['share_at_least_-1_pt']:.0%}; "
        f"< -5 pts on {dist['count_below_-5_pts']}."
    )


def main(spec: RandomRun) -> None:
    """Run, write the results file and the docs block, print the block."""
    family = FAMILIES[spec.family]
    count = f"{len(spec.seeds)} {spec.family} scenarios x {len(spec.policies)} policies"
    print(f"running {count}", flush=True)
    doc = run(spec)
    margins = [e["qlm_margin_pts"] for e in doc["scenarios"].values()]
    doc["margin"] = distribution([m for m in margins if m is not None])
    write_results(family.results, doc)
    block = render(doc)
    write_docs_block(family.block, block)
    print()
    print(block)
