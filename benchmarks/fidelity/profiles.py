"""The step model the simulator runs on: each tiny model profiled up front with `qlm profile`'s
machinery, re-fitted on the live engine just before a run, and the capacity it predicts."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.fidelity.settings import (
    DRIFT_GRID,
    ENGINE,
    GPU_TYPE,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    TRACE,
    Paths,
    say,
)
from qlm.clock import WallClock
from qlm.config.profile_files import ProfileFile, StepTimeConfig, write_profile_file
from qlm.config.vllm_config import VllmEngineConfig
from qlm.engine.profiling.measured import ProfileFit, ProfileTarget, build_profile_file, fit_profile
from qlm.engine.profiling.probes import ProfileGrid
from qlm.engine.profiling.vllm_profiler import VllmProfiler
from qlm.perf.profile import GIB, Profile
from qlm.serve.runtime import Plane
from qlm.types import Fleet


def engine_config(models: Mapping[str, Path]) -> VllmEngineConfig:
    return VllmEngineConfig.model_validate(
        {**ENGINE, "models": {k: str(v) for k, v in models.items()}}
    )


async def profile_model(
    paths: Paths,
    models: Mapping[str, Path],
    name: str,
    grid: ProfileGrid,
    workload: tuple[float, float, int],
    loads: int,
) -> tuple[ProfileFile, ProfileFit]:
    """Profile one model and write its profile file next to the report. loads 2: the start
    and a restart, what a swap costs (for the model swapped to)."""
    mean_out, std_out, typical = workload
    config = engine_config(models)
    profiler = VllmProfiler(config, name, grid, WallClock(), loads=loads, progress=say)
    run = await profiler.run()
    fit = fit_profile(run.samples)
    target = ProfileTarget(
        gpu_type=GPU_TYPE,
        gpu_memory_bytes=GIB,
        output_tokens_mean=mean_out,
        output_tokens_std=std_out,
        typical_context_tokens=typical,
    )
    spec = build_profile_file(run, fit, target)
    write_profile_file(spec, paths.profile(name))
    return spec, fit


def trace_lengths() -> tuple[float, float, int]:
    """Mean and std of the (capped) output lengths and the mean context per sequence of the
    workload's length distribution: what a profile carries about the traffic."""
    rows = np.genfromtxt(TRACE, delimiter=",", names=True, dtype=None, encoding="utf-8")
    prompt = np.asarray(rows["ContextTokens"], dtype=float)
    output = np.asarray(rows["GeneratedTokens"], dtype=float)
    keep = prompt <= MAX_PROMPT_TOKENS
    out = np.minimum(output[keep], MAX_OUTPUT_TOKENS)
    return float(out.mean()), float(out.std()), round(prompt[keep].mean() + out.mean() / 2)


def capacity_rps(profile: Profile, prompt_mean: float, output_mean: float) -> float:
    """Requests per second one instance sustains by the fitted model: a full batch decoding
    at the workload's mean context, plus each prompt's prefill beside it."""
    st = profile.step_time
    assert st is not None
    batch = profile.max_batch_size
    step_s = st.decode_step_s(batch, prompt_mean + output_mean / 2)
    per_request_s = prompt_mean * (st.per_prefill_token_s + st.per_context_token_s)
    per_request_s += output_mean * step_s / batch
    return 1.0 / per_request_s


def inline_profile(p: Profile) -> dict[str, Any]:
    """A Profile as the fleet file's inline form (the profile file format): its decode table
    and prefill rate, no step model, the default KV floor and memory utilisation."""
    plain = replace(p, step_time=None, min_kv_tokens=4096, gpu_memory_utilization=0.9)
    spec = ProfileFile.of(plain, "benchmarks/fidelity/: fitted by qlm profile")
    return spec.model_dump(mode="json", exclude_none=True)


def live_memory_gib(p: Profile) -> float:
    """Memory that gives the inline profile (utilisation 0.9) the measured KV capacity."""
    capacity = p.kv_capacity_tokens(GIB)
    return (p.weight_bytes + (capacity + 0.5) * p.kv_bytes_per_token) / 0.9 / GIB


async def reprofile(plane: Plane, models: Mapping[str, Path], model: str) -> ProfileFit | None:
    """The step model re-fitted on the live plane's first engine, idle between runs."""
    url = getattr(plane.engines[0], "base_url", None)
    if url is None:
        return None
    profiler = VllmProfiler(engine_config(models), model, DRIFT_GRID, WallClock(), progress=None)
    run = await profiler.run_on(url)
    return fit_profile(run.samples)


async def reprofile_together(
    plane: Plane, models: Mapping[str, Path], model: str
) -> ProfileFit | None:
    """The step model fitted while every engine of the live plane runs the probes at once:
    how an engine steps as the fleet runs, when its engines share the host's cores (each
    engine's own times, from vLLM's histograms, pooled into one fit). None for a fleet of
    one engine (the just-before fit is that already). Every engine must hold `model`."""
    urls = [url for e in plane.engines if (url := getattr(e, "base_url", None)) is not None]
    if len(urls) < 2:
        return None
    config = engine_config(models)
    profilers = [
        VllmProfiler(config, model, DRIFT_GRID, WallClock(), seed=i, progress=None)
        for i in range(len(urls))
    ]
    runs = await asyncio.gather(*(p.run_on(url) for p, url in zip(profilers, urls, strict=True)))
    return fit_profile([sample for run in runs for sample in run.samples])


def slowdown(spec: ProfileFile, fit: ProfileFit, prompt_mean: float, output_mean: float) -> float:
    """How much slower `fit` serves the workload than the profile file's step model: the
    ratio of the capacities they predict (>= 1 when the fit is slower)."""
    profile = spec.to_profile()
    return capacity_rps(profile, prompt_mean, output_mean) / capacity_rps(
        refit_profile(spec, fit), prompt_mean, output_mean
    )


def refit_profile(spec: ProfileFile, fit: ProfileFit) -> Profile:
    """The profile file with its step model replaced by a new fit (all else unchanged)."""
    st = fit.fit.step_time
    step = StepTimeConfig(
        base_s=st.base_s,
        per_prefill_token_s=st.per_prefill_token_s,
        per_decode_seq_s=st.per_decode_seq_s,
        per_context_token_s=st.per_context_token_s,
    )
    return spec.model_copy(update={"step_time": step, "decode_table": None}).to_profile()


def with_profiles(fleet: Fleet, replaced: Sequence[Profile]) -> Fleet:
    """The fleet with the given profiles in place of those with the same key."""
    by_key = {p.key: p for p in replaced}
    return Fleet(fleet.instances, {k: by_key.get(k, p) for k, p in fleet.profiles.items()})


def refit_fleet(fleet: Fleet, spec: ProfileFile, fit: ProfileFit) -> Fleet:
    """The fleet with one profile's step model replaced by a new fit (all else unchanged)."""
    return with_profiles(fleet, [refit_profile(spec, fit)])
