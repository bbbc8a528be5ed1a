"""qlm on the many-model family, averaged over the control loop's timing: a decision change on
cases whose outcome moves by several points with the moments the loop runs is judged on the
mean over those moments, not on one run.

    .venv/bin/python -m benchmarks.timing_mean                       # tiered many:0-19
    .venv/bin/python -m benchmarks.timing_mean --seeds 3,5 --no-docs
    .venv/bin/python -m benchmarks.timing_mean --against benchmarks/results/timing_mean_before.json

Each case is a many-model scenario (qlm/sim/fuzz/many_models.py, `many:SEED` at its seed) run
by `qlm simulate`'s `qlm` policy as given and with the control loop's `tick_s` and
`min_replan_interval_s` each 10 % shorter and longer (benchmarks/parity_spread.py's
perturbations: five deterministic runs on the same requests). By default only the scenarios
with a standby tier (on a tier of 0 the swap decisions are cold loads, and the spread is
nil on most). `--against FILE` adds the means of an earlier run of this script (say, on the
code before a change: check that commit out in a git worktree, copy this file into it and run
it there with `--no-docs --out FILE`) and the difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.parity_spread import timing_runs
from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.sim.scenario import Scenario, load_scenario


def tiered(scenario: Scenario) -> bool:
    """Whether the scenario's instances have a standby tier."""
    return scenario.engine.standby_models > 0


def run_case(seed: int) -> dict[str, Any]:
    """many:SEED's overall attainment (percent) and swaps over the five timings."""
    scenario = load_scenario(Path(f"many:{seed}"))
    runs = timing_runs(scenario, seed)
    overall = [100 * result.attainment(None) for result in runs]
    swaps = [result.total_swaps for result in runs]
    return {
        "case": f"many:{seed}",
        "seed": seed,
        "tier": scenario.engine.standby_models,
        "overall_pct": overall,
        "mean_pct": statistics.fmean(overall),
        "swaps": swaps,
    }


def table(cases: list[dict[str, Any]], before: dict[str, float]) -> list[str]:
    cols = ["case", "tier", "overall % per timing", "mean %", "swaps"]
    if before:
        cols += ["mean before %", "points"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for c in cases:
        row = [
            c["case"],
            str(c["tier"]),
            " / ".join(f"{v:.1f}" for v in c["overall_pct"]),
            f"{c['mean_pct']:.2f}",
            f"{min(c['swaps'])}-{max(c['swaps'])}",
        ]
        if before:
            was = before.get(c["case"])
            row += ["-", "-"] if was is None else [f"{was:.2f}", f"{c['mean_pct'] - was:+.2f}"]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def summary(cases: list[dict[str, Any]], before: dict[str, float]) -> list[str]:
    means = [c["mean_pct"] for c in cases]
    lines = [f"Mean over {len(cases)} cases: {statistics.fmean(means):.2f} %."]
    diffs = [c["mean_pct"] - before[c["case"]] for c in cases if c["case"] in before]
    if diffs:
        up = sum(d > 0.05 for d in diffs)
        down = sum(d < -0.05 for d in diffs)
        lines.append(
            f"Against the earlier run: {statistics.fmean(diffs):+.2f} points on average over "
            f"{len(diffs)} cases ({up} up, {down} down by more than 0.05; lowest "
            f"{min(diffs):+.2f}, highest {max(diffs):+.2f})."
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--seeds", type=seeds_of, default="0-19", help="many:SEED cases, e.g. 0-19 or 3,5"
    )
    parser.add_argument("--all", action="store_true", help="untiered scenarios too")
    parser.add_argument("--against", type=Path, help="an earlier results file of this script")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "timing_mean.json")
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(args_in)
    header = run_header("timing_mean.py", args_in, "shared")
    before: dict[str, float] = {}
    if args.against is not None:
        earlier = json.loads(args.against.read_text())["cases"]
        before = {c["case"]: c["mean_pct"] for c in earlier}
    cases = []
    for seed in args.seeds:
        if not args.all and not tiered(load_scenario(Path(f"many:{seed}"))):
            continue
        cases.append(run_case(seed))
        print(f"  many:{seed}: mean {cases[-1]['mean_pct']:.2f} %", flush=True)
    finish_header(header)
    lines = [
        "## Many models: qlm averaged over the control loop's timing",
        "",
        *header_lines(header),
        "",
        "`qlm simulate many:SEED --policy qlm` at its seed, as given and with `tick_s` and "
        "`min_replan_interval_s` each 10 % shorter and longer (benchmarks/parity_spread.py); "
        "overall attainment per run, their mean, the range of swaps.",
        "",
        *summary(cases, before),
        "",
        *table(cases, before),
    ]
    print("\n".join(lines))
    if not args.no_docs:
        write_docs_block("timing-mean", "\n".join(lines))
    write_results(args.out, {"header": header, "cases": cases})
    return 0


def seeds_of(text: str) -> list[int]:
    """'0-19' or '3,5,7' (or both, comma-separated) -> the seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        try:
            seeds += list(range(int(low), int(high or low) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a seed or a range A-B") from None
    return seeds


if __name__ == "__main__":
    raise SystemExit(main())
