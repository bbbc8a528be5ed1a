"""The native engine's local policies on a mixed workload: does srpt-mlfq (after Prophet) cut
short requests' time to first token against fcfs, and how long do the long ones then wait?
And does the simulator's engine model, with the same local orders, say the same?

    .venv/bin/python -m benchmarks.local_policy                 # seeds 0,1,2, load 0.8
    .venv/bin/python -m benchmarks.local_policy --seeds 0 --load 0.9

The workload: long requests (a `--long-prompt`-token prompt, `--long-output` output tokens)
and short ones (`--short-prompt`, `--short-output`) arriving at random (uniform times, seeded)
over a window sized so that the engine is busy `--load` of it: the window is the makespan of
the same requests submitted at once under fcfs, divided by the load. Each policy serves the
same arrivals on the same engine settings (tiny Llama of the tests, float32, a step budget of
`--step-tokens` tokens so a long prompt spans several steps; prefix caching and shared-prefix
reads off, since filler prompts are all alike and would hit the cache). Reported per policy:
short and long TTFT (p50, p99, max) and the makespan, per seed and over all seeds; time
counts from each request's submit to its FirstToken event. The same arrivals then go through
the engine model (`waiting_order` fcfs and srpt-mlfq, the same budgets and starvation bound),
its iteration time fitted to the native runner's steps (benchmarks/local_policy_model.py), and
its ratios are reported beside the native ones. Written: JSON in
benchmarks/results/local_policy.json, the "local-policy" block of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common.stats import percentile_or_nan
from benchmarks.common.tables import markdown_table
from benchmarks.local_policy_model import fit_step_time, serve_model
from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.clock import WallClock
from qlm.config.engine_config import EngineConfig
from qlm.config.native_config import NativeEngineConfig
from qlm.engine.engine_types import EngineFailed, FirstToken, RequestFinished
from qlm.engine.native.native_engine import NativeEngine
from qlm.engine.native.runner_config import RunnerConfig
from qlm.types import Instance, Request
from tests.vllm_fixtures import VLLM_PYTHON, build_tiny_models

RESULTS_PATH = RESULTS_DIR / "local_policy.json"
MODEL = "tiny-a"
POLICIES = ("fcfs", "srpt-mlfq")


@dataclass(frozen=True, slots=True)
class Arrival:
    request_id: str
    kind: str  # "short" | "long"
    at_s: float  # offset from the start of the run
    prompt_tokens: int
    output_tokens: int


def workload(args: argparse.Namespace, seed: int, window_s: float) -> list[Arrival]:
    rng = random.Random(seed)
    shapes = [("long", args.long_prompt, args.long_output)] * args.longs
    shapes += [("short", args.short_prompt, args.short_output)] * args.shorts
    arrivals = [
        Arrival(f"s{seed}-{i}", kind, rng.uniform(0.0, window_s), prompt, output)
        for i, (kind, prompt, output) in enumerate(shapes)
    ]
    return sorted(arrivals, key=lambda a: a.at_s)


def request(arrival: Arrival, run: str) -> Request:
    return Request(
        id=f"{run}-{arrival.request_id}",
        model=MODEL,
        prompt_tokens=arrival.prompt_tokens,
        max_output_tokens=arrival.output_tokens,
        slo_class="batch-1",
        arrival_at_s=0.0,
        ttft_deadline_at_s=1e9,
        sampling={"temperature": 0.0, "ignore_eos": True},
    )


async def serve(engine: NativeEngine, arrivals: list[Arrival], run: str) -> dict[str, Any]:
    """Submit each arrival at its time; TTFT per request id and the makespan."""
    started = time.perf_counter()
    submitted: dict[str, float] = {}
    ttft_s: dict[str, float] = {}
    finished: set[str] = set()
    pending = list(arrivals)
    while len(finished) < len(arrivals):
        now = time.perf_counter() - started
        while pending and pending[0].at_s <= now:
            arrival = pending.pop(0)
            engine.submit(request(arrival, run))
            submitted[arrival.request_id] = time.perf_counter()
        for event in engine.poll():
            if isinstance(event, EngineFailed):
                raise RuntimeError(f"the engine failed: {event.reason}")
            if isinstance(event, FirstToken | RequestFinished):
                rid = event.request_id.removeprefix(f"{run}-")
                if isinstance(event, FirstToken):
                    ttft_s[rid] = time.perf_counter() - submitted[rid]
                else:
                    finished.add(rid)
        await asyncio.sleep(0.001)
    return {"ttft_s": ttft_s, "makespan_s": time.perf_counter() - started}


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), 3),
        "p99": round(percentile_or_nan(values, 0.99), 3),
        "max": round(max(values), 3),
    }


def rows_for(
    policy: str,
    seed: int | str,
    arrivals: list[Arrival],
    runs: list[dict[str, Any]],
    engine: str = "native",
) -> dict[str, Any]:
    kinds = {a.request_id: a.kind for a in arrivals}
    ttft = {rid: s for run in runs for rid, s in run["ttft_s"].items()}
    short = summary([s for rid, s in ttft.items() if kinds[rid] == "short"])
    long = summary([s for rid, s in ttft.items() if kinds[rid] == "long"])
    return {
        "engine": engine,
        "policy": policy,
        "seed": seed,
        **{f"short_ttft_{k}_s": v for k, v in short.items()},
        **{f"long_ttft_{k}_s": v for k, v in long.items()},
        "makespan_s": round(max(run["makespan_s"] for run in runs), 2),
    }


def engine_config(
    models: dict[str, Path], args: argparse.Namespace, policy: str
) -> NativeEngineConfig:
    return NativeEngineConfig(
        models={MODEL: models[MODEL]},
        max_num_seqs=args.max_num_seqs,
        max_batched_tokens=args.step_tokens,
        kv_cache_gib=0.25,
        policy=policy,  # type: ignore[arg-type]
        max_wait_steps=args.max_wait_steps,
        prefix_caching=False,
        shared_prefix=False,
    )


async def run_policy(
    models: dict[str, Path], args: argparse.Namespace, policy: str, plans: dict[int, list[Arrival]]
) -> list[dict[str, Any]]:
    instance = Instance(f"native-{policy}", "cpu", 1, 1 << 30, MODEL)
    async with NativeEngine(instance, engine_config(models, args, policy), WallClock()) as engine:
        await engine.wait_ready()
        await serve(engine, workload(args, 10_000, 0.0)[:4], "warm")
        per_seed = {
            seed: await serve(engine, arrivals, f"p{seed}") for seed, arrivals in plans.items()
        }
    rows = [rows_for(policy, seed, plans[seed], [run]) for seed, run in per_seed.items()]
    every = [a for arrivals in plans.values() for a in arrivals]
    rows.append(rows_for(policy, "all", every, list(per_seed.values())))
    for row in rows:
        print(row, flush=True)
    return rows


async def window_s(models: dict[str, Path], args: argparse.Namespace) -> float:
    """The arrival window: the fcfs makespan of the whole workload submitted at once, over
    the load."""
    instance = Instance("native-calibration", "cpu", 1, 1 << 30, MODEL)
    async with NativeEngine(instance, engine_config(models, args, "fcfs"), WallClock()) as engine:
        await engine.wait_ready()
        run = await serve(engine, workload(args, 0, 0.0), "calibrate")
    return float(run["makespan_s"]) / float(args.load)


def model_rows(
    models: dict[str, Path], args: argparse.Namespace, plans: dict[int, list[Arrival]]
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The same arrivals on the engine model, per policy; and the fitted step time."""
    native = RunnerConfig.of(engine_config(models, args, "fcfs"), num_blocks=4096)
    step_time = fit_step_time(models[MODEL], native)
    rows = []
    for policy in POLICIES:
        config = EngineConfig(
            chunk_tokens=args.step_tokens,
            max_num_seqs=args.max_num_seqs,
            waiting_order=policy,  # type: ignore[arg-type]
            max_wait_iterations=args.max_wait_steps,
        )
        runs = {s: serve_model(a, MODEL, step_time, config, 1 << 20) for s, a in plans.items()}
        rows += [rows_for(policy, s, plans[s], [run], "model") for s, run in runs.items()]
        every = [a for arrivals in plans.values() for a in arrivals]
        rows.append(rows_for(policy, "all", every, list(runs.values()), "model"))
    fitted = {k: getattr(step_time, k) for k in step_time.__slots__}
    return rows, fitted


def ratios(rows: list[dict[str, Any]], engine: str = "native") -> dict[str, float]:
    """srpt-mlfq over fcfs, over all seeds."""
    by_policy = {r["policy"]: r for r in rows if r["seed"] == "all" and r["engine"] == engine}
    fcfs, srpt = by_policy["fcfs"], by_policy["srpt-mlfq"]
    keys = ["short_ttft_p50_s", "short_ttft_p99_s", "long_ttft_p50_s", "long_ttft_max_s"]
    return {key: round(srpt[key] / fcfs[key], 3) for key in keys if fcfs[key] > 0}


def render(report: dict[str, Any]) -> str:
    columns = list(report["rows"][0])
    table = markdown_table(report["rows"], columns, lambda v, _: str(v))
    s = report["settings"]
    model = report["model_ratios"]
    ratio_lines = [
        f"- {k}: srpt-mlfq / fcfs = {v} (engine model: {model.get(k, 'n/a')})"
        for k, v in report["ratios"].items()
    ]
    fitted = ", ".join(f"{k} {v:.3g}" for k, v in report["model_step_time"].items())
    return "\n".join(
        [
            "## Native engine local policies: fcfs against srpt-mlfq on a mixed workload",
            "",
            *header_lines(report),
            "",
            f"{s['longs']} long requests ({s['long_prompt']}-token prompt, {s['long_output']} "
            f"output tokens) and {s['shorts']} short ones ({s['short_prompt']} / "
            f"{s['short_output']}), arriving at uniform random times over "
            f"{s['window_s']:.1f} s (load {s['load']}: the fcfs makespan of the workload "
            f"submitted at once, over the load), per seed; tiny Llama, float32, "
            f"{s['step_tokens']} tokens per step, at most {s['max_num_seqs']} sequences, "
            f"srpt-mlfq's starvation bound {s['max_wait_steps']} steps; prefix caching off. "
            "TTFT from submit to the first token, in seconds. Engine `model`: the simulator's "
            "engine model on the same arrivals, its iteration time fitted to the native "
            f"runner's steps ({fitted}).",
            "",
            table,
            "",
            "Over all seeds:",
            "",
            *ratio_lines,
        ]
    )


async def main_async(args: argparse.Namespace, argv: list[str]) -> int:
    report = run_header("local_policy.py", argv, "shared and noisy; one run at a time")
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        models = build_tiny_models(Path(folder), VLLM_PYTHON)
        window = await window_s(models, args)
        plans = {seed: workload(args, seed, window) for seed in seeds}
        rows = [row for p in POLICIES for row in await run_policy(models, args, p, plans)]
        simulated, fitted = model_rows(models, args, plans)
    keys = ["longs", "long_prompt", "long_output", "shorts", "short_prompt", "short_output"]
    keys += ["load", "step_tokens", "max_num_seqs", "max_wait_steps"]
    report["settings"] = {k: getattr(args, k) for k in keys} | {"window_s": window}
    report["seeds"] = seeds
    report["rows"] = rows + simulated
    report["ratios"] = ratios(rows)
    report["model_ratios"] = ratios(simulated, "model")
    report["model_step_time"] = fitted
    finish_header(report)
    block = render(report)
    print(block)
    write_results(RESULTS_PATH, report)
    write_docs_block("local-policy", block)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--longs", type=int, default=8)
    parser.add_argument("--long-prompt", type=int, default=1536)
    parser.add_argument("--long-output", type=int, default=32)
    parser.add_argument("--shorts", type=int, default=48)
    parser.add_argument("--short-prompt", type=int, default=32)
    parser.add_argument("--short-output", type=int, default=8)
    parser.add_argument("--step-tokens", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-wait-steps", type=int, default=64)
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args, argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
