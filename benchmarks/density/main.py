"""benchmarks/density/: many models on few GPUs (issue 18). For the long-tail scenario
(benchmarks/density/scenario.py), the smallest fleet at which overall SLO attainment reaches
the target, per approach (benchmarks/density/run.py):

    .venv/bin/python -m benchmarks.density                  # seed 0, 16 models, target 0.99
    .venv/bin/python -m benchmarks.density --seeds 0,1 --models 12
    .venv/bin/python -m benchmarks.density --seeds 0,1,2 --grid 5/2,8/2  # why fleets miss
    .venv/bin/python -m benchmarks.density --grid 5/2 --slice-memory 0.5,0.25,0.25
    .venv/bin/python -m benchmarks.density --grid 5/2 --slice-memory 0.5,0.25,0.25 \
        --no-wake-for-backlog                               # wakes by queued promises alone
    .venv/bin/python -m benchmarks.density --grid 6/1 --slice-memory 0.5,0.25,0.25 \
        --large-memory 0.5,0.5                              # two 70B engines per A100 set

Approaches: `qlm-edf` pooled with the standby tier (3 sleeping models per instance, wake in the
profile's wake_s), with two or three engines sharing each H100 (fleet `slices`, pooled KV) and
two sharing each A100 set, the same with cold swaps only, and dedicated placement (each model
on its own replicas, no swaps) scheduled by `qlm-edf` and by `llmd`. qlm runs with its EDF
planner (`qlm-edf`): the MILP planner spends its 0.8 s limit on most of the replans of a
16-model fleet, some 10 minutes of wall time per 20-minute simulation, too slow for a search of
a dozen fleets on this machine. Written: benchmarks/results/density.json, the "density" block
of docs/benchmarks.md and docs/density/gpus.png. `--grid` writes nothing: for each seed and
fleet (H100/A100 counts) it prints qlm's attainment, swaps and misses by cause.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.common.tables import markdown_table
from benchmarks.density.run import dedicated_fleet, fetch_pairs, grid_rows, pooled_fleet
from benchmarks.density.scenario import long_tail
from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.sim.scenario import Scenario

RESULTS_PATH = RESULTS_DIR / "density.json"
PLOT_PATH = Path(__file__).resolve().parents[2] / "docs" / "density" / "gpus.png"
POLICY = "qlm-edf"


Shares = tuple[float, ...] | None
# (standby tier, memory shares of the engines of an H100, of an A100 set (None: one engine),
# label); the engines of a shared GPU set pool their KV
POOLED: tuple[tuple[bool, Shares, Shares, str], ...] = (
    (True, (0.5, 0.25, 0.25), (0.5, 0.5),
     "qlm pooled, standby tier, 3 engines per H100, 2 per A100 set"),
    (True, (0.5, 0.25, 0.25), None, "qlm pooled, standby tier, 3 engines per H100"),
    (True, (0.5, 0.5), None, "qlm pooled, standby tier, 2 engines per H100"),
    (True, None, None, "qlm pooled, standby tier"),
    (False, None, None, "qlm pooled, cold swaps"),
)  # fmt: skip


def run_seed(args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    rows = []
    for standby, shares, large, label in POOLED:
        scenario = _scenario(args, seed, standby, shares, large)
        requests = scenario.requests(seed)
        print(f"seed {seed}: {label} ({len(requests)} requests)", flush=True)
        fleet = pooled_fleet(
            scenario, requests, POLICY, seed, args.target, args.max_small, (1, 2, 3)
        )
        rows.append(_row(seed, label, fleet))
    scenario = long_tail(seed, args.models, args.peak_rate, standby=False)
    requests = scenario.requests(seed)
    for policy, label in ((POLICY, "dedicated, qlm"), ("llmd", "dedicated, llmd")):
        print(f"seed {seed}: {label}", flush=True)
        fleet, _ = dedicated_fleet(scenario, requests, policy, seed, args.target, args.max_small)
        rows.append(_row(seed, label, fleet))
    return rows


def _scenario(
    args: argparse.Namespace, seed: int, standby: bool, shares: Shares, large: Shares = None
) -> Scenario:
    """The long-tail scenario; with `shares`, one engine per share on every H100 (with
    `large`, on every A100 set), pooling KV."""
    if shares is None:
        return long_tail(seed, args.models, args.peak_rate, standby=standby)
    return long_tail(seed, args.models, args.peak_rate, standby=standby, slices=len(shares),
                     kv_pool=True, slice_memory=shares, large_memory=large)  # fmt: skip


def fetch_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for seed in (int(s) for s in args.fetch_seeds.split(",")):
        scenario = long_tail(seed, args.models, args.peak_rate)
        print(f"seed {seed}: fetching into the standby tiers, off and on", flush=True)
        fleets = args.fetch_fleets.split(",")
        rows += fetch_pairs(scenario, scenario.requests(seed), POLICY, seed, fleets)
    return rows


def _row(seed: int, label: str, fleet: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"seed": seed, "approach": label}
    if fleet is None:
        return row | {"gpus": "none found", "cost_per_hour": "", "attainment": "", "counts": ""}
    found = fleet.as_dict()
    counts = ", ".join(f"{n} x {g}" for g, n in found.pop("counts").items())
    return row | found | {"counts": counts}


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for seed in sorted({r["seed"] for r in rows}):
        mine = {r["approach"]: r for r in rows if r["seed"] == seed}
        found = [mine[label]["gpus"] for standby, _, _, label in POOLED if standby]
        qlm = min((v for v in found if isinstance(v, int)), default=None)
        dedicated = mine["dedicated, qlm"]["gpus"]
        llmd = mine["dedicated, llmd"]["gpus"]
        if qlm is None or not all(isinstance(v, int) for v in (dedicated, llmd)):
            lines.append(f"- seed {seed}: a search found no fleet (see the table): MISS")
            continue
        saving = 1 - qlm / dedicated
        ok = saving >= 0.5 and qlm < llmd
        lines.append(
            f"- seed {seed}: qlm (best of its pooled fleets with the standby tier) {qlm} GPUs, "
            f"dedicated {dedicated}, llmd {llmd}: "
            f"{saving:.0%} fewer than dedicated (target >= 50 %), "
            f"{'fewer' if qlm < llmd else 'not fewer'} than llmd: {'PASS' if ok else 'MISS'}"
        )
    return lines


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Bars: GPUs of each approach's smallest fleet, per seed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    approaches = list(dict.fromkeys(r["approach"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    width = 0.8 / max(len(seeds), 1)
    for j, seed in enumerate(seeds):
        values = [
            next((r["gpus"] for r in rows if r["seed"] == seed and r["approach"] == a), 0)
            for a in approaches
        ]
        heights = [v if isinstance(v, int) else 0 for v in values]
        xs = [i + j * width for i in range(len(approaches))]
        ax.bar(xs, heights, width, label=f"seed {seed}")
    ticks = [a.replace(", ", ",\n") for a in approaches]
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(approaches))], ticks, fontsize=7)
    ax.set_ylabel("GPUs of the smallest fleet meeting the target")
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})


def render(report: dict[str, Any]) -> str:
    s = report["settings"]
    columns = ["seed", "approach", "gpus", "cost_per_hour", "counts", "attainment", "evaluations"]
    table = markdown_table(report["rows"], columns, lambda v, _: str(v))
    return "\n".join(
        [
            "## Density: many models on few GPUs (simulator)",
            "",
            *header_lines(report),
            "",
            f"{s['models']} models (60 % 7B, 25 % 13B, 15 % 70B copies of the packaged profiles), "
            f"Zipf {s['zipf_s']} popularity, a compressed day of 1,200 s (night 0.3 x, ramps, "
            f"peak {s['peak_rate']} req/s, evening 0.4 x) with bursts of a fifth of the models; "
            "70 % interactive (TTFT 5 s), 30 % batch (600 s); gamma arrivals, cv 2. Pools: 1-GPU "
            "H100 (7B, 13B) and 4-GPU A100 (70B and any). The smallest fleet whose overall "
            f"attainment reaches {s['target']} (cost: A100 3.7, H100 6.9 per GPU-hour); each run "
            "drains (arrivals stop at 1,200 s, the run goes on until every request has ended, "
            "so none is judged before its deadline). qlm runs "
            "as `qlm-edf` (EDF planner; the MILP is too slow for a search here). Dedicated: each "
            "model alone on k replicas until it meets the target; its attainment is then "
            "measured with all models at once. `2 engines per H100` and `3 engines per H100`: "
            "each H100 holds engines with their own models, weights in their share of the "
            "memory (halves; or 0.5, 0.25, 0.25, so a 13B model fits the first beside two 7B), "
            "KV from one pool (kvcached-style), taking turns on the compute while several are "
            "busy (fleet `slices`, `slice_memory`, `kv_pool`; qlm/sim/sharing.py: with n busy, "
            "each iteration n times as long); each model starts in the smallest share it fits; "
            "GPUs count once. `2 per A100 set`: each 4-GPU A100 set the same way in halves, so "
            "two 70B models stay resident beside each other (their weights leave about 12 GB "
            "of KV between them). The verdict takes qlm's fewest "
            "GPUs over its pooled fleets with the standby tier.",
            "",
            table,
            "",
            "![GPUs per approach](density/gpus.png)",
            "",
            "### Verdict",
            "",
            *report["verdict"],
            *fetch_section(report.get("fetch", [])),
        ]
    )


def fetch_section(rows: list[dict[str, Any]]) -> list[str]:
    """The paired table: the standby tiers filled by worth (on, the default) or only by what
    each instance served (off), on the same fleets and requests."""
    if not rows:
        return []
    gains = [r["points"] for r in rows]
    columns = ["seed", "fleet", "gpus", "off", "on", "points"]
    return [
        "",
        "### Filling the standby tiers (qlm/agents/warming.py)",
        "",
        "qlm-edf's attainment with the instances fetching models into their standby tiers "
        "(`on`, the default: by worth, shared with the instances that hold a model already, "
        "and a model held nowhere in the place of a second copy) and with the tiers holding "
        "only what each instance served (`off`), same fleets, same requests. "
        f"Mean {sum(gains) / len(gains):+.2f} points over {len(gains)} pairs; "
        f"{sum(g > 0 for g in gains)} up, {sum(g < 0 for g in gains)} down.",
        "",
        markdown_table(rows, columns, lambda v, _: str(v)),
    ]


def grid(args: argparse.Namespace, seeds: list[int]) -> int:
    """`--grid`: the misses on given fleets, by cause, printed (nothing written)."""
    rows = []
    shares, large = (
        tuple(float(x) for x in value.split(",")) if value else None
        for value in (args.slice_memory, args.large_memory)
    )
    for seed in seeds:
        scenario = _scenario(args, seed, True, shares, large)
        requests = scenario.requests(seed)
        options = {"wake_for_backlog": args.wake_for_backlog}
        rows += grid_rows(scenario, requests, POLICY, seed, args.grid.split(","), options)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    print(markdown_table(rows, columns, lambda v, _: "0" if v is None else str(v)))
    gains = [row["attainment"] for row in rows]
    print(f"mean attainment {sum(gains) / len(gains):.4f} over {len(rows)} runs")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--peak-rate", type=float, default=12.0)
    parser.add_argument("--target", type=float, default=0.99)
    parser.add_argument("--max-small", type=int, default=24)
    parser.add_argument("--fetch-seeds", default="0,1,2", help="seeds of the fetch table")
    parser.add_argument("--fetch-fleets", default="10/2,12/2,8/3,10/3", help="H100/A100 counts")
    parser.add_argument("--grid", help="H100/A100 counts: attainment and misses by cause only")
    parser.add_argument(
        "--slice-memory", help="--grid: engines per H100 by memory share, e.g. 0.5,0.25,0.25"
    )
    parser.add_argument(
        "--large-memory", help="--grid, with --slice-memory: engines per A100 set, e.g. 0.5,0.5"
    )
    parser.add_argument(
        "--no-wake-for-backlog", dest="wake_for_backlog", action="store_false",
        help="--grid: wakes weigh queued promises alone (qlm_dispatch.py `_backlog_risk`)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.grid:
        return grid(args, seeds)
    report = run_header("density.py", argv, "shared and noisy; simulated time")
    rows = [row for seed in seeds for row in run_seed(args, seed)]
    report["settings"] = {
        "models": args.models,
        "peak_rate": args.peak_rate,
        "target": args.target,
        "zipf_s": 1.1,
        "seeds": seeds,
    }
    report["rows"] = rows
    report["fetch"] = fetch_rows(args)
    report["verdict"] = verdict(rows)
    finish_header(report)
    block = render(report)
    print(block)
    plot(rows, PLOT_PATH)
    write_results(RESULTS_PATH, report)
    write_docs_block("density", block)
    return 0
