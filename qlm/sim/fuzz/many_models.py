"""Many models, few GPUs: random scenarios where the fleet must swap (`many:SEED`).

Each model is a copy of a packaged 7B, 13B or 70B profile under a name of its own
(`mistral-7b-03`), so a model no instance holds must be loaded (a cold load, or a wake where
the engines keep a standby tier). Drawn from the seed alone:

* a fleet of 4-8 instances: one GPU (A100 or H100) or as many as a 70B needs (a 4-GPU
  instance also runs the small models), so some 70B copies have a home;
* 2-4x as many models as instances (7B half of them, 13B 30 %, 70B 20 % where an instance can
  run it), each with its own arrival stream: popularity Zipf over a random ranking (exponent
  0.8-1.4), gamma gaps (cv 1-3), a burst (2-5x for 10-25 % of the window) on 30 % of them,
  and its own class mix (interactive and batch-1 weights 0.4-0.9 and the rest of 1, plus a
  batch-2 weight of 0.05-0.3 on a third of them);
* at the start each instance holds one of the most requested models it can run;
* a standby tier of 0 (half the seeds), 1 or 2 models per instance;
* a window of 120-300 s and a load of 0.3-0.8 of what the best fractional placement serves
  (`capacity.fleet_capacity_per_s`, which pays no load time: the true load is higher),
  300-1,500 requests.

`qlm simulate many:7` runs one, as `random:7` runs qlm/sim/fuzz's mixed scenarios.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qlm.config.profile_files import ProfileFile
from qlm.sim.fuzz.build import DATA_DIR, FuzzDraw, instance_rates, stream_document
from qlm.sim.fuzz.choices import AZURE, InstancePlan, LengthMix, Shape, StreamPlan, fitting_profiles
from qlm.sim.fuzz.throughput import fleet_capacity_per_s

MANY_PREFIX = "many:"
BASES = (("mistral-7b", 0.5), ("vicuna-13b", 0.3), ("llama-70b", 0.2))
LENGTHS = LengthMix("azure", AZURE, "azure")
MIN_REQUESTS, MAX_REQUESTS = 300, 1500
MAX_ATTEMPTS = 200


def parse_many_name(name: str) -> int | None:
    """'many:SEED' -> SEED; None for any other name; ValueError for a malformed one."""
    if not name.startswith(MANY_PREFIX):
        return None
    seed_text = name[len(MANY_PREFIX) :]
    if not seed_text.isdigit():
        raise ValueError(f"{name}: expected many:SEED with SEED >= 0")
    return int(seed_text)


def draw_many_models(seed: int, data_dir: Path = DATA_DIR) -> FuzzDraw:
    """The many-model scenario of this seed with its sizing figures."""
    for attempt in range(MAX_ATTEMPTS):
        rng = np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(1, attempt)))
        found = _attempt(seed, rng, data_dir)
        if found is not None:
            return dataclasses.replace(found, attempts=attempt + 1)
    raise RuntimeError(f"many:{seed}: no scenario within bounds in {MAX_ATTEMPTS} draws")


def _fleet(rng: np.random.Generator) -> list[InstancePlan]:
    """4-8 instances: 70 % one GPU, 30 % as many as a 70B needs on that GPU type."""
    fleet = []
    for _ in range(int(rng.integers(4, 9))):
        gpu = ("A100", "H100")[int(rng.integers(2))]
        big = rng.random() < 0.3
        base = "llama-70b" if big else "mistral-7b"
        fleet.append(InstancePlan(gpu, fitting_profiles()[(base, gpu)].gpu_count, base))
    return fleet


def _models(rng: np.random.Generator, fleet: Sequence[InstancePlan]) -> dict[str, str]:
    """Model name -> its base: 2-4x as many as instances; a 70B only where one can run."""
    big = any(i.gpu_count >= fitting_profiles()[("llama-70b", i.gpu_type)].gpu_count for i in fleet)
    bases = [(b, w) for b, w in BASES if big or b != "llama-70b"]
    weights = np.asarray([w for _, w in bases])
    count = round(len(fleet) * float(rng.uniform(2.0, 4.0)))
    picks = rng.choice(len(bases), size=count, p=weights / weights.sum())
    return {f"{bases[k][0]}-{n:02d}": bases[k][0] for n, k in enumerate(picks)}


def _runs(instance: InstancePlan, base: str) -> bool:
    profile = fitting_profiles().get((base, instance.gpu_type))
    return profile is not None and instance.gpu_count >= profile.gpu_count


def _streams(rng: np.random.Generator, models: Mapping[str, str]) -> list[StreamPlan]:
    """One stream per model; shares Zipf over a random ranking."""
    exponent = float(rng.uniform(0.8, 1.4))
    ranks = rng.permutation(len(models)) + 1
    weights = 1.0 / ranks.astype(np.float64) ** exponent
    weights /= weights.sum()
    streams = []
    for (name, _), share in zip(models.items(), weights, strict=True):
        interactive = round(float(rng.uniform(0.4, 0.9)), 3)
        classes = {"interactive": interactive, "batch-1": round(1.0 - interactive, 3)}
        if rng.random() < 1 / 3:
            classes = {**classes, "batch-2": round(float(rng.uniform(0.05, 0.3)), 3)}
        bursts: tuple[tuple[float, float, float], ...] = ()
        if rng.random() < 0.3:
            start = round(float(rng.uniform(0.0, 0.8)), 3)
            bursts = (
                (
                    start,
                    round(float(rng.uniform(0.1, 0.25)), 3),
                    round(float(rng.uniform(2, 5)), 2),
                ),
            )
        shape = Shape(0.0, round(float(rng.uniform(1.0, 3.0)), 2), bursts)
        streams.append(StreamPlan(name, False, float(share), {name: 1.0}, classes, LENGTHS, shape))
    return streams


def _placement(
    fleet: Sequence[InstancePlan], models: Mapping[str, str], streams: Sequence[StreamPlan]
) -> list[str]:
    """Each instance's initial model: the most requested one it can run not yet placed."""
    by_share = sorted(streams, key=lambda s: -s.share)
    placed: list[str] = []
    for instance in fleet:
        runnable = [s.name for s in by_share if _runs(instance, models[s.name])]
        fresh = [m for m in runnable if m not in placed]
        placed.append((fresh or runnable)[0])
    return placed


def _attempt(seed: int, rng: np.random.Generator, data_dir: Path) -> FuzzDraw | None:
    fleet = _fleet(rng)
    models = _models(rng, fleet)
    if any(not any(_runs(i, base) for i in fleet) for base in models.values()):
        return None
    streams = _streams(rng, models)
    initial = _placement(fleet, models, streams)
    # Capacity by base model: copies of one base cost the same on an instance.
    base_fleet = [
        dataclasses.replace(i, model=models[m]) for i, m in zip(fleet, initial, strict=True)
    ]
    base_streams = [dataclasses.replace(s, models={models[s.name]: 1.0}) for s in streams]
    shares: dict[str, float] = {}
    for s in streams:
        shares[models[s.name]] = shares.get(models[s.name], 0.0) + s.share
    capacity = fleet_capacity_per_s(instance_rates(base_fleet, base_streams, data_dir), shares)
    load = float(rng.uniform(0.3, 0.8))
    window_s = math.floor(float(rng.uniform(120.0, 300.0)) * 10.0) / 10.0
    requests = load * capacity * window_s
    if not MIN_REQUESTS <= requests <= MAX_REQUESTS:
        return None
    standby = 0 if rng.random() < 0.5 else int(rng.integers(1, 3))
    document = _document(
        seed, fleet, initial, models, streams, requests, window_s, standby, data_dir
    )
    return FuzzDraw(
        seed=seed,
        document=document,
        load_factor=load,
        capacity_per_s=capacity,
        window_s=window_s,
        expected_requests=requests,
        model_shares={s.name: s.share for s in streams},
        class_shares={},
        attempts=0,
    )


def _document(
    seed: int,
    fleet: Sequence[InstancePlan],
    initial: Sequence[str],
    models: Mapping[str, str],
    streams: Sequence[StreamPlan],
    requests: float,
    window_s: float,
    standby: int,
    data_dir: Path,
) -> dict[str, Any]:
    groups: dict[tuple[str, int, str], int] = {}
    for instance, model in zip(fleet, initial, strict=True):
        key = (instance.gpu_type, instance.gpu_count, model)
        groups[key] = groups.get(key, 0) + 1
    profiles = [
        _copy(profile_key, name)
        for name, base in models.items()
        for profile_key in fitting_profiles()
        if profile_key[0] == base and any(i.gpu_type == profile_key[1] for i in fleet)
    ]
    return {
        "name": f"many-{seed}",
        "description": f"{len(models)} models on {len(fleet)} instances, standby tier {standby}",
        "seed": seed,
        "fleet": {
            "instances": [
                {"gpu_type": g, "gpu_count": c, "count": n, "model": m}
                for (g, c, m), n in groups.items()
            ],
            "profiles": profiles,
            "packaged_profiles": False,
        },
        "engine": {"standby_models": standby},
        "workload": [stream_document(s, requests, window_s, data_dir) for s in streams],
    }


def _copy(key: tuple[str, str], name: str) -> dict[str, Any]:
    """The packaged profile `key` as an inline profile of the model `name`."""
    profile = dataclasses.replace(fitting_profiles()[key], model=name)
    note = f"a copy of the packaged {key[0]} on {key[1]} (qlm/sim/fuzz/many_models.py)"
    return ProfileFile.of(profile, note).model_dump(mode="json", exclude_none=True)
