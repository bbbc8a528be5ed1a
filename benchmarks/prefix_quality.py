"""Prefix-aware scheduling benchmark: every policy on the shared-prefix scenarios (issue 14).

    .venv/bin/python -m benchmarks.prefix_quality                  # seeds 0, 1, 7
    .venv/bin/python -m benchmarks.prefix_quality --seeds 1        # one seed

Runs each policy on sims/prefix-quick.yaml, sims/mooncake-quick.yaml and
sims/hot-prefix-quick.yaml at each seed and
reports SLO attainment, prefix reuse (prompt tokens found in the engines' prefix caches) beside
one infinite cache's (the oracle), and request latency (arrival to last token, over completed
requests) beside a round-robin router's, as Preble reports it. Verdicts: qlm's overall
attainment >= every other policy's, and its reuse >= 90 % of the oracle's on prefix-quick
(mooncake-quick's oracle, one cache holding every conversation for the whole trace, is far
beyond any fleet's KV: reported, not checked).

Writes benchmarks/results/prefix_quality.json and the "prefix-quality" block of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from benchmarks.common.stats import percentile
from benchmarks.common.tables import markdown_table
from benchmarks.report import (
    RESULTS_DIR,
    ROOT,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.sim.result import OutcomeState, SimResult
from qlm.sim.scenario import load_scenario
from qlm.sim.simulate import SimulatedEngines, simulate
from qlm.sim.workload.prefixes import oracle_reuse

RESULTS_PATH = RESULTS_DIR / "prefix_quality.json"
SCENARIOS = ("prefix-quick", "mooncake-quick", "hot-prefix-quick")
POLICIES = ("round-robin", "fcfs", "edf", "shepherd", "llmd", "llmd-prefix", "preble", "qlm")
REUSE_CHECKED = ("prefix-quick",)
REUSE_TARGET = 0.9


def run_point(scenario_name: str, seed: int) -> dict[str, Any]:
    scenario = load_scenario(ROOT / "sims" / f"{scenario_name}.yaml")
    requests = scenario.requests(seed)
    prompt, hit = oracle_reuse([(r.prompt_tokens, r.prefix) for r in requests if r.prefix])
    rows = []
    for policy in POLICIES:
        engines = SimulatedEngines(scenario.engine)
        result = simulate(
            scenario.fleet(), requests, policy, scenario.config, seed, engine_factory=engines
        )
        rows.append(policy_row(policy, result))
        print(f"{scenario_name} seed {seed} {policy}: {rows[-1]['overall']:.3f}", flush=True)
    return {"scenario": scenario_name, "seed": seed, "oracle_reuse": hit / prompt, "rows": rows}


def policy_row(policy: str, result: SimResult) -> dict[str, Any]:
    latencies = [
        o.finish_s - o.arrival_s
        for o in result.outcomes
        if o.state is OutcomeState.COMPLETED and o.finish_s is not None
    ]
    reuse = result.prefix_reuse()
    return {
        "policy": policy,
        "overall": result.attainment(),
        **result.attainment_by_class(),
        "reuse": None if reuse is None else reuse["reuse"],
        "latency_mean_s": sum(latencies) / len(latencies) if latencies else None,
        "latency_p99_s": percentile(latencies, 0.99),
        "ttft_p50_s": result.ttft_p50_s,
        "ttft_p99_s": result.ttft_p99_s,
        "completed": len(latencies),
        "requests": result.num_requests,
    }


def verdict(point: dict[str, Any]) -> dict[str, Any]:
    rows = {row["policy"]: row for row in point["rows"]}
    qlm = rows["qlm"]
    others = [row for name, row in rows.items() if name != "qlm"]
    best = max(others, key=lambda row: row["overall"])
    rr = rows["round-robin"]
    reuse_share = (qlm["reuse"] or 0.0) / point["oracle_reuse"]
    checked = point["scenario"] in REUSE_CHECKED
    return {
        "scenario": point["scenario"],
        "seed": point["seed"],
        "qlm >= every policy": "PASS" if qlm["overall"] >= best["overall"] else "MISS",
        "margin (pts)": f"{100 * (qlm['overall'] - best['overall']):+.1f} (vs {best['policy']})",
        "reuse / oracle": f"{reuse_share:.2f}",
        "reuse >= 0.9 oracle": ("PASS" if reuse_share >= REUSE_TARGET else "MISS")
        if checked
        else "not checked",
        "mean latency / round-robin": _ratio(qlm["latency_mean_s"], rr["latency_mean_s"]),
        "p99 latency / round-robin": _ratio(qlm["latency_p99_s"], rr["latency_p99_s"]),
    }


def _ratio(value: float | None, reference: float | None) -> str:
    return "-" if value is None or not reference else f"{value / reference:.2f}"


def fmt(value: object, column: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if column in ("overall", "interactive", "batch-1", "batch-2", "reuse"):
            return f"{100 * value:.1f}%"
        return f"{value:.2f}"
    return str(value)


def render(report: dict[str, Any]) -> str:
    lines = [
        "## Prefix-aware scheduling: policies on the shared-prefix scenarios",
        "",
        "Every policy on sims/prefix-quick.yaml, sims/mooncake-quick.yaml and "
        "sims/hot-prefix-quick.yaml (sims/README.md) at "
        "each seed. `reuse`: prompt tokens found in the engines' prefix caches over prompt tokens "
        "admitted; `oracle`: one infinite cache over the same requests. Latency: arrival to last "
        "token over completed requests (seconds). The verdict compares qlm with every other "
        "policy, and its latency with round-robin's.",
        "",
        *header_lines(report["header"]),
        "",
        "### Verdict",
        "",
        markdown_table(
            [verdict(point) for point in report["points"]],
            list(verdict(report["points"][0])),
            fmt,
        ),
    ]
    columns = ["policy", "overall", "interactive", "batch-1", "reuse", "latency_mean_s"]
    columns += ["latency_p99_s", "ttft_p50_s", "ttft_p99_s", "completed"]
    for point in report["points"]:
        lines += [
            "",
            f"### {point['scenario']}, seed {point['seed']} (oracle reuse "
            f"{100 * point['oracle_reuse']:.1f}%)",
            "",
            markdown_table(point["rows"], columns, fmt),
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,7", help="comma-separated seeds")
    args = parser.parse_args(argv)
    header = run_header("prefix_quality.py", sys.argv[1:] if argv is None else argv, "shared")
    seeds = [int(s) for s in args.seeds.split(",")]
    points = [run_point(name, seed) for name in SCENARIOS for seed in seeds]
    finish_header(header)
    report: dict[str, Any] = {"header": header, "points": points}
    write_results(RESULTS_PATH, report)
    block = render(report)
    print(block)
    write_docs_block("prefix-quality", block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
