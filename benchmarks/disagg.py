"""Prefill/decode split against co-located serving, simulated: where disaggregation pays.

Each scenario's fleet is run co-located (`qlm` and `llmd`, every instance role both) and split
into prefill and decode pools (every split of its GPU types: k of each type's instances
prefill, the rest decode; at least one of each role) under `disagg` (qlm/sim/policies/
disagg.py: llm-d's scoring, Dynamo's conditional disaggregation, handed-off KV over each
instance's 25 GB/s link, qlm/sim/handoff.py). `planner's`: the split qlm/solver/pd_split.py
chooses in closed form from the scenario's traffic, routed as `disagg` routes. qlm also runs
on the planner's split and on disagg's best one. Its dispatch stays work-conserving across
roles: a decode instance pulls any request of its model and prefills it itself, and only
prefill instances hand off (leaving long prompts to the prefill pool while a prefill engine
would start them in time, as Dynamo does by queue length, halved TBT but cost 0.4 to 14.2
points of attainment on these scenarios at seed 0: QLM's classes promise TTFT and completion,
not TBT). TBT: a request's decode time over its
tokens after the first (completed requests with at least two tokens).

    .venv/bin/python -m benchmarks.disagg                       # mooncake-quick, wc-quick, seed 0
    .venv/bin/python -m benchmarks.disagg --seeds 0 1 7 --no-docs
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common.stats import percentile
from benchmarks.common.tables import markdown_table
from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.sim.policies.disagg import MAX_LOCAL_PREFILL_TOKENS
from qlm.sim.result import SimResult
from qlm.sim.scenario import Scenario, load_scenario
from qlm.sim.simulate import SimConfig, SimulatedEngines, simulate
from qlm.solver.pd_split import PhaseDemand, choose_split
from qlm.types import Fleet, InstanceRole, Request

ROOT = Path(__file__).resolve().parents[1]
RESULTS_PATH = RESULTS_DIR / "disagg.json"
DOCS_BLOCK = "disagg"
SCENARIOS = ("mooncake-quick", "wc-quick")
LATENCY_CLASS = "interactive"


def splits(fleet: Fleet) -> list[tuple[str, Fleet]]:
    """Every split by GPU type (k of each type's instances prefill), named like `1P3D` per
    type; at least one prefill and one decode instance."""
    by_type: dict[str, list[str]] = {}
    for instance in fleet.instances:
        by_type.setdefault(instance.gpu_type, []).append(instance.id)
    out = []
    for counts in itertools.product(*(range(len(ids) + 1) for ids in by_type.values())):
        prefill = {i for ids, k in zip(by_type.values(), counts, strict=True) for i in ids[:k]}
        if not prefill or len(prefill) == len(fleet.instances):
            continue
        name = " + ".join(
            f"{gpu} {k}P{len(ids) - k}D"
            for (gpu, ids), k in zip(by_type.items(), counts, strict=True)
        )
        instances = tuple(
            dataclasses.replace(
                i, role=InstanceRole.PREFILL if i.id in prefill else InstanceRole.DECODE
            )
            for i in fleet.instances
        )
        out.append((name, Fleet(instances, fleet.profiles)))
    return out


def measure(result: SimResult) -> dict[str, Any]:
    outcomes = result.outcomes
    ttft = [
        o.first_token_s - o.arrival_s
        for o in outcomes
        if o.slo_class == LATENCY_CLASS and o.first_token_s is not None
    ]
    by_class = result.attainment_by_class()
    return {
        "overall_pct": 100 * result.attainment(),
        "latency_class_pct": 100 * by_class.get(LATENCY_CLASS, math.nan),
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p99_s": percentile(ttft, 0.99),
        "tbt_p50_ms": result.tbt_quantile_ms(0.5),
        "tbt_p99_ms": result.tbt_quantile_ms(0.99),
        "interrupted": dict(Counter(a.reason for a in result.interrupted)),
    }


def planner_split(requests: list[Request], fleet: Fleet) -> str | None:
    """The split qlm/solver/pd_split.py chooses for the scenario's one model, routed as
    `disagg` routes (prompts up to its local limit prefilled where they decode)."""
    models = {r.model for r in requests}
    if len(models) != 1:
        return None
    (model,) = models
    demand = PhaseDemand.of(requests, MAX_LOCAL_PREFILL_TOKENS)
    choice = choose_split(fleet.instances, fleet.profiles, model, demand)
    if choice is None:
        return None
    prefill = set(choice.prefill_ids)
    return next(name for name, split in splits(fleet) if _prefill_ids(split) == prefill)


def _prefill_ids(fleet: Fleet) -> set[str]:
    return {i.id for i in fleet.instances if i.role is InstanceRole.PREFILL}


def run_case(scenario: Scenario, seed: int) -> list[dict[str, Any]]:
    requests = scenario.requests(seed)
    options = SimConfig(max_time_s=scenario.horizon_s or math.inf)
    engines = SimulatedEngines(scenario.engine)
    base = scenario.fleet()
    fleets = dict(splits(base))
    chosen = planner_split(requests, base)

    def one(policy: str, split: str, fleet: Fleet) -> dict[str, Any]:
        result = simulate(
            fleet, requests, policy, scenario.config, seed, options=options, engine_factory=engines
        )
        row = {"policy": policy, "split": split, "planner's": split == chosen}
        return row | measure(result)

    rows = [one("qlm", "co-located", base), one("llmd", "co-located", base)]
    split_rows = [one("disagg", name, fleet) for name, fleet in fleets.items()]
    rows += split_rows
    best = max(split_rows, key=lambda r: (r["overall_pct"], r["latency_class_pct"]))
    for name in dict.fromkeys(n for n in (chosen, best["split"]) if n is not None):
        rows.append(one("qlm", name, fleets[name]))
    return rows


def verdict(case: dict[str, Any]) -> dict[str, Any]:
    rows = case["rows"]
    llmd = next(r for r in rows if r["policy"] == "llmd")
    qlm = next(r for r in rows if r["policy"] == "qlm" and r["split"] == "co-located")
    split = [r for r in rows if r["policy"] == "disagg"]
    best = max(split, key=lambda r: (r["overall_pct"], r["latency_class_pct"]))
    planned = next((r for r in split if r["planner's"]), None)
    qlm_planned = next((r for r in rows if r["policy"] == "qlm" and r["planner's"]), None)
    return {
        "scenario": case["scenario"],
        "seed": case["seed"],
        "best split (disagg)": best["split"],
        "planner's split": "-" if planned is None else planned["split"],
        "overall: best / planner's split (disagg), llmd": f"{best['overall_pct']:.1f} / "
        + ("-" if planned is None else f"{planned['overall_pct']:.1f}")
        + f", {llmd['overall_pct']:.1f} %",
        "TBT p50: best split / llmd (ms)": f"{best['tbt_p50_ms']:.1f} / {llmd['tbt_p50_ms']:.1f}",
        "qlm interactive: co-located / planner's split": f"{qlm['latency_class_pct']:.1f} / "
        + ("-" if qlm_planned is None else f"{qlm_planned['latency_class_pct']:.1f} %"),
        "qlm interactive TTFT p99: co-located / planner's split (s)": f"{qlm['ttft_p99_s']:.2f}"
        + ("" if qlm_planned is None else f" / {qlm_planned['ttft_p99_s']:.2f}"),
        "qlm overall: co-located / planner's split": f"{qlm['overall_pct']:.1f} / "
        + ("-" if qlm_planned is None else f"{qlm_planned['overall_pct']:.1f} %"),
    }


def render(report: dict[str, Any]) -> str:
    verdicts = [verdict(c) for c in report["cases"]]
    lines = [
        "## Prefill/decode split against co-located serving (simulator)",
        "",
        *header_lines(report),
        "",
        (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        "",
        "### Verdict",
        "",
        markdown_table(verdicts, list(verdicts[0]) if verdicts else [], _cell),
    ]
    columns = [
        "policy",
        "split",
        "planner's",
        "overall_pct",
        "latency_class_pct",
        "ttft_p50_s",
        "ttft_p99_s",
    ]
    columns += ["tbt_p50_ms", "tbt_p99_ms", "interrupted"]
    for case in report["cases"]:
        lines += ["", f"### {case['scenario']}, seed {case['seed']}", ""]
        lines.append(markdown_table(case["rows"], columns, _cell))
    return "\n".join(lines)


def _cell(value: object, column: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "-"
    return f"{value:,.2f}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    report: dict[str, Any] = run_header("disagg.py", argv or sys.argv[1:], "simulated")
    report["cases"] = []
    for name in args.scenarios:
        scenario = load_scenario(ROOT / "sims" / f"{name}.yaml")
        for seed in args.seeds:
            rows = run_case(scenario, seed)
            report["cases"].append({"scenario": name, "seed": seed, "rows": rows})
    finish_header(report)
    write_results(RESULTS_PATH, report)
    text = render(report)
    print(text)
    if not args.no_docs:
        write_docs_block(DOCS_BLOCK, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
