"""The long-tail multi-model scenario of benchmarks/density/, built from a seed.

Question answered: what does a fleet serving many models of very different popularity face?
`long_tail(seed, ...)` gives a Scenario of `models` models (about 60 % 7B, 25 % 13B, 15 % 70B,
each a copy of the packaged Mistral-7B, Vicuna-13B or Llama-70B profiles under its own name,
so each has its own weights and must be loaded) whose popularity follows Zipf (exponent
`zipf_s`, ranks in a seeded random order of the models), over a compressed day: a quiet night
(0.3 x the peak rate), a morning ramp, a peak, an evening ramp down to 0.4 x; on top, a few
seeded models burst (4 x their own rate for 60 s). Requests are interactive (TTFT 5 s) or batch
(TTFT 600 s), with Azure-conversation lengths; arrivals are gamma with cv 2.

The fleet has two pools: 1-GPU H100 instances (they serve the 7B and 13B models) and 4-GPU
A100 instances (the 70B models, and any smaller one). Groups list the models by popularity,
so a fleet sized by `Scenario.with_fleet_counts` starts with the popular models placed.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from qlm.config.profile_files import load_profile_file, packaged_profile_paths
from qlm.sim.scenario import Scenario

SIZES = (("7b", "mistral-7b", "H100"), ("13b", "vicuna-13b", "H100"), ("70b", "llama-70b", "A100"))
SMALL, LARGE = "H100", "A100"
TRACE = Path(__file__).resolve().parents[2] / "sims" / "data" / "azure_llm_2023_conv.csv"
AZURE = {"source": "trace", "path": str(TRACE), "format": "azure"}
DAY = ((0.0, 300.0, 0.3, 0.3), (300.0, 300.0, 0.3, 1.0), (600.0, 300.0, 1.0, 1.0))
EVENING = (900.0, 300.0, 1.0, 0.4)
HORIZON_S = 1200.0


def model_names(count: int) -> list[tuple[str, str]]:
    """(name, base model) for `count` models: 60 % 7B, 25 % 13B, the rest 70B (one at least)."""
    large = max(1, round(0.15 * count))
    medium = round(0.25 * count)
    small = count - large - medium
    kinds = [SIZES[0]] * small + [SIZES[1]] * medium + [SIZES[2]] * large
    seen: dict[str, int] = {}
    names = []
    for size, base, _ in kinds:
        seen[size] = seen.get(size, 0) + 1
        names.append((f"m{size}-{seen[size]:02d}", base))
    return names


def _profiles(models: list[tuple[str, str]], standby: bool) -> list[dict[str, Any]]:
    """Each model's copies of its base model's packaged profiles on the two GPU types."""
    packaged = {path.stem: path for path in packaged_profile_paths()}
    files = []
    for name, base in models:
        for gpu in (SMALL, LARGE):
            path = packaged.get(f"{base}_{gpu}")
            if path is None:
                continue
            spec = load_profile_file(path).model_copy(update={"model": name})
            if not standby:
                spec = spec.model_copy(update={"wake_s": None})
            files.append(spec.model_dump(mode="json", exclude={"provenance"}))
    return files


def popularity(models: list[tuple[str, str]], seed: int, zipf_s: float) -> dict[str, float]:
    """Model -> share of the traffic: Zipf over a seeded random ranking."""
    order = [name for name, _ in models]
    random.Random(seed).shuffle(order)
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(len(order))]
    total = sum(weights)
    return {name: w / total for name, w in zip(order, weights, strict=True)}


def _streams(shares: dict[str, float], peak_rate: float, seed: int) -> list[dict[str, Any]]:
    classes = {"interactive": 0.7, "batch": 0.3}
    arrivals = {"process": "gamma", "cv": 2.0}
    streams = []
    for k, (start, length, first, last) in enumerate((*DAY, EVENING)):
        stream: dict[str, Any] = {
            "name": f"day-{k}",
            "arrivals": arrivals | {"rate_per_s": peak_rate * first},
            "start_s": start,
            "duration_s": length,
            "models": shares,
            "classes": classes,
            "lengths": AZURE,
        }
        if first != last:
            stream["ramp"] = {"to_rate_per_s": peak_rate * last}
        streams.append(stream)
    rng = random.Random(seed + 1)
    for name in rng.sample(sorted(shares), k=max(1, len(shares) // 5)):
        rate = peak_rate * shares[name]
        streams.append(
            {
                "name": f"burst-{name}",
                "arrivals": arrivals | {"rate_per_s": 3.0 * rate},
                "start_s": round(rng.uniform(0.0, HORIZON_S - 60.0), 1),
                "duration_s": 60.0,
                "models": {name: 1.0},
                "classes": classes,
                "lengths": AZURE,
            }
        )
    return streams


def long_tail(
    seed: int,
    models: int = 16,
    peak_rate: float = 12.0,
    zipf_s: float = 1.1,
    standby: bool = True,
    slices: int = 1,
    kv_pool: bool = False,
    slice_memory: tuple[float, ...] | None = None,
    large_memory: tuple[float, ...] | None = None,
) -> Scenario:
    """The scenario (module docstring); `standby` False drops the profiles' wake_s (every
    swap is a cold load); `slices` engines share each H100, pooling their KV with `kv_pool`
    (fleet_config's `slices`, `kv_pool`, `slice_memory`); `large_memory`, one share per
    engine, shares each A100 set the same way (its engines always pool their KV)."""
    names = model_names(models)
    shares = popularity(names, seed, zipf_s)
    base = dict(names)
    by_rank = sorted(shares, key=lambda m: -shares[m])
    groups = [
        {"gpu_type": LARGE, "count": 1, "model": m}
        if base[m] == "llama-70b"
        else {"gpu_type": SMALL, "count": 1, "model": m, "slices": slices, "kv_pool": kv_pool}
        for m in by_rank
    ]
    for group in groups:
        if group["gpu_type"] == SMALL and slice_memory is not None:
            group["slice_memory"] = list(slice_memory)
        if group["gpu_type"] == LARGE and large_memory is not None:
            group |= {"slices": len(large_memory), "kv_pool": True,
                      "slice_memory": list(large_memory)}  # fmt: skip
    document = {
        "name": f"long-tail-{models}",
        "seed": seed,
        "slo_classes": [
            {"name": "interactive", "ttft_s": 5.0, "lateness_weight": 100, "priority": 2},
            {"name": "batch", "ttft_s": 600.0, "lateness_weight": 1, "priority": 0},
        ],
        "fleet": {"instances": groups, "profiles": _profiles(names, standby)},
        "workload": _streams(shares, peak_rate, seed),
        "horizon_s": HORIZON_S,
        "engine": {"standby_models": 3 if standby else 0},
    }
    return Scenario.model_validate(document)
