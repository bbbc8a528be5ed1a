"""`qlm profile`: measure a live engine, fit the step model, write a profile file.

    qlm profile --engine vllm --model PATH [--gpu-type NAME] [--out FILE] [--quick]

Starts the engine with the model (timing the load), runs the planned grid of prefill, decode
and mixed probes (probes.py), fits t = b0 + b1 prefill + b2 decodes + b3 context by
non-negative least squares on relative error, prints the fit quality (R^2, maximum relative
error) and writes the profile file (qlm/config/profile_files.py format, provenance `measured`,
the grid and every measured iteration under `measurement`), which `qlm simulate` reads through
a scenario's `fleet.profile_files`. How to run it and what it measures: README.md here.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from qlm.clock import WallClock
from qlm.config import load_yaml_model
from qlm.config.profile_files import ProfileFile, write_profile_file
from qlm.engine.profiling.measured import (
    ModelFacts,
    ProfileFit,
    ProfileRun,
    ProfileTarget,
    build_profile_file,
    fit_profile,
)
from qlm.engine.profiling.probes import ProfileGrid
from qlm.perf.profile import GIB
from qlm.registry import Registry
from qlm.types import DEFAULT_GPU_TYPES

ProfileJob = Coroutine[Any, Any, ProfileRun]
PROFILE_ENGINES: Registry[ProfileJob] = Registry("profiling engine")


@PROFILE_ENGINES.register("vllm")
def _vllm(args: argparse.Namespace, grid: ProfileGrid) -> ProfileJob:
    from qlm.config.vllm_config import VllmEngineConfig
    from qlm.engine.profiling.vllm_profiler import VllmProfiler
    from qlm.engine.profiling.vllm_setup import profile_engine_config

    name = args.name or args.model.name
    config = VllmEngineConfig(
        python=args.python,
        models={name: args.model},
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        dtype=args.dtype,
        kv_cache_gib=args.kv_cache_gib,
        extra_args=tuple(args.extra_arg or ()),
        env=dict(_pair(e) for e in args.env or ()),
        cpu_cores=args.cpu_cores,
        log_dir=args.log_dir,
        standby_models=1 if args.standby else 0,
    )
    config = profile_engine_config(config, args.max_num_batched_tokens)
    progress = None if args.quiet else _progress
    profiler = VllmProfiler(
        config, name, grid, WallClock(), loads=args.loads, seed=args.seed, progress=progress
    )
    return profiler.run()


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "profile", help="measure a live engine and write a profile file for the simulator"
    )
    p.add_argument("--engine", default="vllm", help=f"known: {PROFILE_ENGINES.names()}")
    p.add_argument("--model", type=Path, required=True, help="Hugging Face model folder")
    p.add_argument("--name", help="served model name (default: the folder's name)")
    p.add_argument("--gpu-type", default="cpu", help="GPU type of the profile (default cpu)")
    p.add_argument(
        "--gpu-memory-gib",
        type=float,
        help="memory per GPU (default: the known type's; else the whole GiB that holds "
        "weights and KV cache)",
    )
    p.add_argument("--out", type=Path, help="profile file (default NAME_GPUTYPE.yaml)")
    p.add_argument(
        "--grid", type=Path, help="YAML of ProfileGrid fields (qlm/engine/profiling/probes.py)"
    )
    p.add_argument("--quick", action="store_true", help="the small grid (about 16 probes)")
    p.add_argument("--repeats", type=int, help="times each probe runs (overrides the grid)")
    p.add_argument("--loads", type=int, default=1, help="model loads to time (1: the start)")
    p.add_argument(
        "--standby",
        action="store_true",
        help="also time --loads switches back to a standby server (the standby tier: "
        "engine.vllm.standby_models) and write wake_s",
    )
    p.add_argument("--output-tokens-mean", type=float, default=211.1)
    p.add_argument("--output-tokens-std", type=float, default=162.9)
    p.add_argument("--typical-context-tokens", type=int, help="where the decode table is taken")
    p.add_argument("--seed", type=int, default=0, help="prompt token ids")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    vllm = p.add_argument_group("vllm engine")
    vllm.add_argument("--python", type=Path, default=Path(".venv-vllm/bin/python"))
    vllm.add_argument("--max-num-seqs", type=int, default=8)
    vllm.add_argument("--max-model-len", type=int, default=4096)
    vllm.add_argument("--max-num-batched-tokens", type=int, default=2048)
    vllm.add_argument("--kv-cache-gib", type=float, default=1 / 16)
    vllm.add_argument("--dtype", default="auto")
    vllm.add_argument("--env", action="append", help="KEY=VALUE for the server (repeatable)")
    vllm.add_argument(
        "--cpu-cores",
        type=_cores,
        help="comma-separated CPU cores for the server (CPU engines: steadier timings)",
    )
    vllm.add_argument("--extra-arg", action="append", help="extra server argument (repeatable)")
    vllm.add_argument("--log-dir", type=Path, help="server logs (default: a temporary folder)")
    p.set_defaults(handler=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    grid = _grid(args)
    command = PROFILE_ENGINES.get(args.engine)
    from qlm.engine.engine_types import EngineError
    from qlm.engine.profiling.probe_client import ProfilingError

    try:
        run = asyncio.run(command(args, grid))
        fit = fit_profile(run.samples)
    except (ProfilingError, EngineError, ValueError) as exc:
        print(f"qlm profile: error: {exc}", file=sys.stderr)
        return 1
    target = ProfileTarget(
        gpu_type=args.gpu_type,
        gpu_memory_bytes=_gpu_memory_bytes(args.gpu_type, args.gpu_memory_gib, run.facts),
        output_tokens_mean=args.output_tokens_mean,
        output_tokens_std=args.output_tokens_std,
        typical_context_tokens=args.typical_context_tokens,
    )
    spec = build_profile_file(run, fit, target)
    out = args.out or Path(f"{spec.model}_{spec.gpu_type}.yaml")
    write_profile_file(spec, out)
    print(report(run, fit, spec, target, out))
    return 0


def report(
    run: ProfileRun, fit: ProfileFit, spec: ProfileFile, target: ProfileTarget, out: Path
) -> str:
    """What `qlm profile` prints: the coefficients, the fit quality, loads and where to use it."""
    st = fit.fit.step_time
    q = fit.quality()
    r2 = "n/a" if q.r_squared is None else f"{q.r_squared:.4f}"
    lines = [
        f"{spec.model} on {target.gpu_type}: {q.samples} iterations in {run.wall_s:.0f} s "
        f"({run.engine}; load average {run.load_average[0]:.2f})",
        f"  t = {st.base_s * 1e3:.3f} ms + {st.per_prefill_token_s * 1e6:.3f} us x prefill "
        f"+ {st.per_decode_seq_s * 1e6:.3f} us x decodes + {st.per_context_token_s * 1e9:.3f} "
        "ns x context",
        f"  fit: R^2 {r2}, max relative error {q.max_relative_error:.1%}, "
        f"rms {q.rms_relative_error:.1%}",
    ]
    for kind, (n, worst) in fit.quality_by_kind().items():
        lines.append(f"    {kind:<8} {n:>3} samples, max relative error {worst:.1%}")
    loads = ", ".join(f"{x:.1f}" for x in run.load_s)
    lines.append(f"  load: {spec.load_s:.1f} s (median of {loads})")
    if spec.wake_s is not None:
        wakes = ", ".join(f"{x:.2f}" for x in run.wake_s)
        ratio = spec.load_s / spec.wake_s if spec.wake_s > 0 else float("inf")
        lines.append(f"  wake from standby: {spec.wake_s:.2f} s (median of {wakes}; {ratio:.0f}x)")
    if spec.measurement is not None and spec.measurement.request_overhead_s is not None:
        overhead_ms = 1e3 * spec.measurement.request_overhead_s
        lines.append(f"  request overhead outside the engine: {overhead_ms:.1f} ms (median)")
    memory_gib = target.gpu_memory_bytes / GIB
    lines += [
        f"wrote {out}",
        "use it in a scenario: fleet: {profile_files: [" + str(out) + "], "
        f"gpu_types: {{{target.gpu_type}: {{memory_gib: {memory_gib:g}}}}}, ...}}",
    ]
    return "\n".join(lines)


def _grid(args: argparse.Namespace) -> ProfileGrid:
    grid = load_yaml_model(args.grid, ProfileGrid) if args.grid else None
    grid = grid or (ProfileGrid.quick() if args.quick else ProfileGrid())
    if args.repeats is not None:
        grid = ProfileGrid.model_validate({**grid.model_dump(), "repeats": args.repeats})
    return grid


def _gpu_memory_bytes(gpu_type: str, memory_gib: float | None, facts: ModelFacts) -> int:
    if memory_gib is not None:
        return int(memory_gib * GIB)
    known = DEFAULT_GPU_TYPES.get(gpu_type)
    if known is not None:
        return known.memory_bytes
    need = facts.weight_bytes + facts.kv.capacity_tokens * facts.kv.bytes_per_token
    return max(1, math.ceil(need / GIB)) * GIB


def _cores(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(c) for c in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"cores as 0,1,...; got {text!r}") from None


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"qlm profile: --env wants KEY=VALUE, got {text!r}")
    return key, value


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
