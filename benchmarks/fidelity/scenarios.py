"""One run's two inputs: the scenario file (its Poisson workload on the fitted profiles, which
`qlm simulate` replays) and the live plane's configuration (vLLM engines as profiled, the
estimator on the fitted profiles)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks.fidelity.profiles import engine_config, inline_profile, live_memory_gib
from benchmarks.fidelity.settings import (
    AGENT,
    CLASS_MIX,
    ENGINE,
    GPU_TYPE,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    QLM,
    SLO_CLASSES,
    TRACE,
    Paths,
    RunSpec,
)
from benchmarks.report import ROOT
from qlm.config import QlmConfig
from qlm.config.profile_files import ProfileFile
from qlm.config.serve_config import ServeConfig
from qlm.sim.scenario import Scenario, load_scenario


def scenario_dict(
    run: RunSpec, rate_per_s: float, profile_files: Sequence[str], trace: str
) -> dict[str, Any]:
    return {
        "name": f"fidelity-{run.name}",
        "description": f"benchmarks/fidelity/ run {run.name}: {run.instances} vLLM-CPU "
        f"instance(s), {run.load:.0%} of the fitted capacity",
        "seed": run.seed,
        "slo_classes": list(SLO_CLASSES),
        "fleet": {
            "gpu_types": {GPU_TYPE: {"memory_gib": 1.0}},
            "profile_files": list(profile_files),
            "instances": [
                {"gpu_type": GPU_TYPE, "count": run.instances, "model": "tiny-a", "id": "cpu"}
            ],
        },
        "workload": [
            {
                "name": run.name,
                "arrivals": {"process": "poisson", "rate_per_s": round(rate_per_s, 3)},
                "duration_s": run.duration_s,
                "models": dict(run.models),
                "classes": CLASS_MIX,
                "lengths": {
                    "source": "trace",
                    "path": trace,
                    "format": "azure",
                    "max_prompt_tokens": MAX_PROMPT_TOKENS,
                    "max_output_tokens": MAX_OUTPUT_TOKENS,
                },
            }
        ],
        "qlm": QLM,
    }


def write_scenario(
    paths: Paths, run: RunSpec, rate_per_s: float, models: Sequence[str]
) -> Scenario:
    folder = paths.scenarios
    folder.mkdir(parents=True, exist_ok=True)
    files = [os.path.relpath(paths.profile(m), folder) for m in models]
    trace = os.path.relpath(TRACE, folder)
    path = folder / f"{run.name}.yaml"
    shown = os.path.relpath(path, ROOT)
    header = (
        "# Written by benchmarks/fidelity/: the workload of one fidelity run, on the fitted\n"
        f"# profiles. Replay it in the simulator: qlm simulate {shown} --policy qlm\n"
    )
    data = scenario_dict(run, rate_per_s, files, trace)
    body = yaml.safe_dump(data, sort_keys=False, width=100)
    path.write_text(header + body)
    return load_scenario(path)


def serve_config(
    run: RunSpec, profiles: Mapping[str, ProfileFile], models: Mapping[str, Path], qlm: QlmConfig
) -> ServeConfig:
    """The live plane of a run: vLLM engines as profiled, the estimator on the fitted
    profiles (as inline decode tables; the estimator reads nothing else). The instances are
    named as in the run's scenario (one group: cpu, or cpu-0, cpu-1, ...)."""
    inline = [inline_profile(p.to_profile()) for p in profiles.values()]
    memory = {p.to_profile().model: live_memory_gib(p.to_profile()) for p in profiles.values()}
    return ServeConfig.model_validate(
        {
            "qlm": qlm.model_dump(),
            "agent": AGENT,
            "api": {"port": 0},
            # every swap and eviction of a run stays in the recorder's events (the report's
            # swap timeline reads them; the dashboard's default keeps the last 50)
            "metrics": {"recent_events": 10_000},
            "engine": {"kind": "vllm", "vllm": engine_config(models).model_dump(mode="json")},
            "models": [{"name": m, "max_context_tokens": ENGINE["max_model_len"]} for m in models],
            "fleet": {
                "gpu_types": {GPU_TYPE: {"memory_gib": max(memory.values())}},
                "packaged_profiles": False,
                "profiles": inline,
                "instances": [
                    {"id": "cpu", "gpu_type": GPU_TYPE, "model": "tiny-a", "count": run.instances}
                ],
            },
        }
    )
