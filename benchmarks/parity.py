"""Parity: the live plane against the simulator on the same requests.

Each case is a scenario at a seed: the shipped quick scenarios (wa-, wb-, wc-quick) at seeds 0,
1 and 7, and random scenarios from qlm/sim/fuzz (`random:K`, several models and swaps among
them). Each is replayed `--repeats` times (in rounds: every case once, then again, so that a case's
repeats are spread over the run) through the public API into an embedded plane on
emulated engines (`qlm replay --embedded`: profiles, SLO targets and loop periods scaled by
the speedup, qlm/replay/embedded.py), and simulated once with `qlm` (deterministic). The
speedup is at most `--speedup` and keeps the replay's arrival rate at or below `--max-rps`
requests per wall second (this machine's two cores also run the plane; at 100 requests a
second the API fell behind on scenarios of 8 instances or mega prompts, and at 50 the client
and the API reached wc-quick's plane 5-30 s late). A replay that did not keep the scenario's
arrival times (a class's p99 arrival lag past 10 % of its TTFT target, or a request lost) is
not faithful (qlm/replay/compare.py `replay_health`): it is listed as such and never counts as
within bounds, whatever its gap.

Each case also simulates the baselines (sim_quality's: fcfs, edf, shepherd, llmd) on the same
requests: the live plane should keep at least the best of them (`live >= baselines`).

A case is within bounds when the median live run is within 2 points of the simulated overall
attainment and 3 points in every class, and its swaps within 25 % (or one swap) of the
simulated ones. Each case is also simulated with its control loop's periods 10 % shorter and
longer (benchmarks/parity_spread.py): where the simulated outcome itself moves by more than the
bounds, a live run within that spread differs by timing, not by a rule. Reported with it: the
spread of the live repeats, TTFT p50/p99, and the accuracy of the wait estimate each plane
gives (live: the API's x-qlm-estimated-wait-s; simulated: the policy's prediction at arrival):
median absolute error as a share of the class's TTFT target (worst class), and how often the
TTFT came within it.

    .venv/bin/python -m benchmarks.parity                     # every case, 3 repeats
    .venv/bin/python -m benchmarks.parity --repeats 1 --random 6 --no-docs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.parity_spread import (
    CLASS_POINTS,
    OVERALL_POINTS,
    describe,
    inside,
    simulated_spread,
    swap_slack,
)
from benchmarks.parity_table import LEGEND, table, versus_baselines
from benchmarks.report import (
    RESULTS_DIR,
    code_version,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from benchmarks.sim_quality.checks import BASELINES
from qlm.replay.compare import FAITHFUL_LAG_SHARE
from qlm.replay.replay_cli import ReplayConfig, run_replay, simulate_same
from qlm.sim.scenario import Scenario, load_scenario

ROOT = Path(__file__).resolve().parent.parent
RESULTS_PATH = RESULTS_DIR / "parity.json"
QUICK = ("wa-quick", "wb-quick", "wc-quick")


def speedup_for(scenario: Scenario, seed: int, most: float, max_rps: float) -> float:
    """The largest speedup up to `most` that keeps arrivals at or below `max_rps`."""
    requests = scenario.requests(seed)
    span_s = max(r.arrival_at_s for r in requests) - min(r.arrival_at_s for r in requests)
    rate = len(requests) / max(span_s, 1.0)
    return round(min(most, max_rps / rate), 2)


def within(case: dict[str, Any]) -> bool:
    """The case's bounds: overall, every class, swaps; only a faithful replay is measured."""
    if case.get("faithful") is False:
        return False
    gap = case["gap_points"]
    classes_ok = all(abs(v) <= CLASS_POINTS for k, v in gap.items() if k != "overall")
    live, sim = case["live_swaps"], case["simulated"]["swaps"]
    swaps_ok = abs(live - sim) <= swap_slack(sim)
    return abs(gap["overall"]) <= OVERALL_POINTS and classes_ok and swaps_ok


# Scenarios drawn from a seed by qlm/sim/fuzz (`random:K`, `many:K`): named, not files.
DRAWN = ("random:", "many:")


def case_path(name: str) -> Path:
    return Path(name) if name.startswith(DRAWN) else ROOT / "sims" / f"{name}.yaml"


def replay_once(
    name: str, seed: int, repeat: int, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """One live replay of a case and its simulation (qlm replay's summary document)."""
    scenario = load_scenario(case_path(name))
    speedup = speedup_for(scenario, seed, args.speedup, args.max_rps)
    out = work / f"{name.replace(':', '-')}-{seed}-{repeat}"
    doc = run_replay(scenario, seed, ReplayConfig(speedup=speedup), out)
    assert doc is not None
    live = doc["live"]
    print(f"  {name} seed {seed} run {repeat}: live {100 * live['overall']:.1f} %, "
          f"simulated {100 * doc['simulated']['overall']:.1f} %", flush=True)  # fmt: skip
    return {**doc, "speedup": speedup}


def summarise_case(
    name: str,
    seed: int,
    runs: Sequence[dict[str, Any]],
    baselines: dict[str, float],
    spread: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A case from its live replays: the median live run against the simulation, beside the
    simulated baselines' attainment on the same requests."""
    overalls = [r["live"]["overall"] for r in runs]
    median_run = sorted(runs, key=lambda r: r["live"]["overall"])[len(runs) // 2]
    case = {
        "case": name,
        "seed": seed,
        "speedup": median_run["speedup"],
        "requests": median_run["live"]["requests"],
        "live": median_run["live"],
        "simulated": median_run["simulated"],
        "gap_points": median_run["gap_points"],
        "live_overall_spread_points": 100 * (max(overalls) - min(overalls)),
        "live_swaps": statistics.median(r["live"]["swaps"] for r in runs),
        "runs": [r["live"] for r in runs],
        # every repeat kept the arrival times (qlm/replay/compare.py replay_health)
        "faithful": all(r["replay"]["faithful"] is not False for r in runs),
        "late": sorted({c for r in runs for c in r["replay"]["late"]}),
    }
    case["within"] = within(case)
    case["baselines"] = baselines
    case["sim_spread"] = spread
    return case


def faithful_by_admission_lag(case: dict[str, Any]) -> bool | None:
    """For results written before the arrival lag was measured: False when the admission lag
    alone (a part of the arrival lag) shows the replay was not faithful, None when it cannot
    tell. At least 1 % of all requests lagged by the p99 or more, so at least 1 % of some
    class's own did; past 10 % of the longest TTFT target, that lag is past every class's
    allowance."""
    lag_s = case["live"].get("admission_lag_p99_s")
    if lag_s is None:
        return None
    name = case["case"]
    path = case_path(name)
    present = case["live"]["by_class"]  # the classes the case's requests are in
    longest_s = max(c.ttft_s for c in load_scenario(path).slo_classes if c.name in present)
    return False if lag_s > FAITHFUL_LAG_SHARE * longest_s else None


def simulated_baselines(scenario: Scenario, seed: int) -> dict[str, float]:
    """Each baseline's simulated overall attainment on the case's requests."""
    requests = scenario.requests(seed)
    return {
        policy: simulate_same(scenario, requests, seed, policy).attainment(None)
        for policy in BASELINES
    }


def add_baselines(path: Path) -> None:
    """Fill in `baselines` for the cases of a results file that lack them (deterministic
    simulations: the same numbers a run would have recorded)."""
    report = json.loads(path.read_text())
    for case in report["cases"]:
        if "baselines" not in case:
            name = case["case"]
            case["baselines"] = simulated_baselines(load_scenario(case_path(name)), case["seed"])
            print(f"  {name} seed {case['seed']}: {versus_baselines(case)}", flush=True)
    write_results(path, report)


def add_spread(paths: Sequence[Path], code: str) -> None:
    """Fill in `sim_spread` for the cases of these results files that lack it, simulated on
    the code checked out now (`code`, recorded with it: the live runs may be older); a case
    in several files is simulated once."""
    done: dict[tuple[str, int], dict[str, Any]] = {}
    for path in paths:
        report = json.loads(path.read_text())
        for case in report["cases"]:
            key = (case["case"], case["seed"])
            if case.get("sim_spread"):
                continue
            if key not in done:
                spread = simulated_spread(load_scenario(case_path(key[0])), key[1])
                done[key] = {**spread, "code": code}
                print(f"  {key[0]} seed {key[1]}: {describe(spread)}", flush=True)
            case["sim_spread"] = done[key]
        write_results(path, report)


def render(reports: Sequence[dict[str, Any]]) -> str:
    """The docs block from one or more results files (a later file's case replaces an
    earlier file's of the same scenario and seed: re-runs of some cases at another speedup)."""
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for report in reports:
        for case in report["cases"]:  # each case stamped with its run's code
            merged[(case["case"], case["seed"])] = {**case, "code": report.get("code", "-")}
    cases = list(merged.values())
    for case in cases:  # results written before faithfulness was measured
        if "faithful" not in case:
            case["faithful"] = faithful_by_admission_lag(case)
            case["late"] = [] if case["faithful"] is not False else ["every class (adm. lag)"]
            case["within"] = case["within"] and case["faithful"] is not False
    held = sum(c["within"] for c in cases)
    unfaithful = sum(c["faithful"] is False for c in cases)
    lines = ["## Parity: live against simulated on the same requests", ""]
    for report in reports:
        lines += header_lines(report)
        lines += [f"Note: {report['note']}", ""] if report.get("note") else [""]
    summary = f"{held} of {len(cases)} cases within bounds; {unfaithful} replays not faithful."
    spread = [c for c in cases if c.get("sim_spread")]
    if spread:
        codes = sorted({str(c["sim_spread"].get("code", "-")) for c in spread})
        inside_n = sum(bool(inside(c)) for c in spread)
        summary += (
            f" Live inside the simulated timing spread on {inside_n} of {len(spread)} cases "
            f"(spreads simulated on code {', '.join(codes)})."
        )
    lines += [table(cases), "", summary, "", LEGEND]
    return "\n".join(lines)


def cases_to_run(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(case, seed): each shipped scenario at each seed, then each random one at its own."""
    todo = [(n, s) for n in args.quick if not n.startswith(DRAWN) for s in args.seeds]
    todo += [(n, load_scenario(Path(n)).seed) for n in args.quick if n.startswith(DRAWN)]
    todo += [(f"random:{k}", load_scenario(Path(f"random:{k}")).seed) for k in range(args.random)]
    return todo


def run_rounds(args: argparse.Namespace, report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every case replayed `args.repeats` times, round by round: a case's repeats are spread
    over the whole run, not back to back (repeats made minutes apart agreed within 0.2 points
    while a run half an hour later differed by 5 in a class: the host's conditions drift).
    The results so far are written after each round, should the run be stopped."""
    todo = cases_to_run(args)
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {case: [] for case in todo}
    baselines: dict[tuple[str, int], dict[str, float]] = {}  # simulated once per case
    spreads: dict[tuple[str, int], dict[str, Any]] = {}  # likewise
    code = str(report.get("code", "-"))
    cases: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="qlm-parity-") as tmp:
        for repeat in range(args.repeats):
            for name, seed in todo:
                runs[name, seed].append(replay_once(name, seed, repeat, args, Path(tmp)))
                if (name, seed) not in baselines:
                    scenario = load_scenario(case_path(name))
                    baselines[name, seed] = simulated_baselines(scenario, seed)
                    spreads[name, seed] = {**simulated_spread(scenario, seed), "code": code}
            cases = [
                summarise_case(
                    name, seed, runs[name, seed], baselines[name, seed], spreads[name, seed]
                )
                for name, seed in todo
            ]
            write_results(args.results, {**report, "cases": cases, "partial": True})
    return cases


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        nargs="*",
        default=list(QUICK),
        help="shipped scenarios (or random:K, many:K at its seed)",
    )
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 7])
    parser.add_argument("--random", type=int, default=20, help="random scenarios random:0..N-1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--speedup", type=float, default=4.0)
    parser.add_argument("--max-rps", type=float, default=25.0)
    parser.add_argument("--results", type=Path, default=RESULTS_PATH, help="results JSON file")
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--note", help="what this run re-measures and why (shown in the block)")
    parser.add_argument(
        "--render", type=Path, nargs="+", help="only write the docs block from these results"
    )
    parser.add_argument(
        "--add-baselines",
        type=Path,
        nargs="+",
        help="only simulate the baselines of these results' cases that lack them (results "
        "written before the baselines were part of a case), in place",
    )
    parser.add_argument(
        "--add-spread",
        type=Path,
        nargs="+",
        help="only simulate the timing spread (parity_spread.py) of these results' cases that "
        "lack it, on the code checked out now, in place",
    )
    args = parser.parse_args(argv)
    if args.add_baselines:
        for path in args.add_baselines:
            add_baselines(path)
        return 0
    if args.add_spread:
        add_spread(args.add_spread, code_version())
        return 0
    if args.render:
        write_docs_block("parity", render([json.loads(p.read_text()) for p in args.render]))
        return 0
    report = run_header("parity.py", argv, "emulated engines, in-memory queue")
    if args.note:
        report["note"] = args.note
    cases = run_rounds(args, report)
    finish_header(report)
    report["cases"] = cases
    report["bounds"] = {"overall_points": OVERALL_POINTS, "class_points": CLASS_POINTS}
    write_results(args.results, report)
    print(table(cases))
    print(f"{sum(c['within'] for c in cases)} of {len(cases)} cases within bounds")
    if not args.no_docs:
        write_docs_block("parity", render([report]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
