"""The random choices of a fuzzed scenario, before its rates are known: which models, which
streams (arrival shape, model and class mix, lengths) and which fleet. qlm/sim/fuzz/build.py
turns a plan into a Scenario once the fleet's capacity has fixed the request rates.

Everything is drawn from one numpy Generator, so the same generator state gives the same plan.
Shapes are stated as fractions of the arrival window, whose length is chosen later.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from qlm.config.profile_files import packaged_profiles
from qlm.perf.profile import Profile
from qlm.types import DEFAULT_GPU_TYPES, DEFAULT_SLO_CLASSES


@dataclass(frozen=True)
class LengthMix:
    """A length distribution drawn from a packaged trace (sims/data), optionally filtered."""

    name: str
    file: str
    format: str
    min_prompt_tokens: int | None = None
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None


AZURE = "azure_llm_2023_conv.csv"
MOONCAKE = "mooncake_conversation.jsonl"
# Mooncake prompts are cut at 56k tokens so that prompt plus a capped output (2k) fits every
# packaged instance's KV cache (the smallest: Vicuna-13B on an A100, 62.6k tokens).
LENGTH_MIXES: tuple[tuple[LengthMix, float], ...] = (
    (LengthMix("azure", AZURE, "azure"), 0.35),
    (LengthMix("azure-short", AZURE, "azure", max_prompt_tokens=512), 0.15),
    (LengthMix("azure-long", AZURE, "azure", min_prompt_tokens=2000), 0.2),
    (LengthMix("mooncake", MOONCAKE, "mooncake", None, 56_000, 2048), 0.2),
    (LengthMix("mega", MOONCAKE, "mooncake", 16_000, 56_000, 2048), 0.1),
)


@dataclass(frozen=True)
class Shape:
    """When a stream starts and how its arrivals vary. Times are fractions of the window."""

    start_frac: float = 0.0
    cv: float = 1.0  # of the gamma gaps
    bursts: tuple[tuple[float, float, float], ...] = ()  # (start, duration, factor)
    ramp: tuple[float, float, float] | None = None  # (start, end, end rate / start rate)


@dataclass(frozen=True)
class StreamPlan:
    """One stream: `share` of the scenario's requests."""

    name: str
    backlog: bool
    share: float
    models: Mapping[str, float]
    classes: Mapping[str, float]
    lengths: LengthMix
    shape: Shape


@dataclass(frozen=True)
class InstancePlan:
    """One instance: its GPU type, GPUs (its initial model's profile's) and initial model."""

    gpu_type: str
    gpu_count: int
    model: str


@functools.cache
def fitting_profiles() -> Mapping[tuple[str, str], Profile]:
    """Packaged profiles whose model fits its GPU type's built-in memory, by (model, GPU)."""
    out = {}
    for profile in packaged_profiles():
        gpu = DEFAULT_GPU_TYPES.get(profile.gpu_type)
        if gpu is not None and profile.fits(gpu.memory_bytes):
            out[profile.key] = profile
    return MappingProxyType(dict(sorted(out.items())))


def can_run(instance: InstancePlan, model: str) -> Profile | None:
    """The profile instance runs model with, if it can (qlm.types.Fleet.can_serve's rule)."""
    profile = fitting_profiles().get((model, instance.gpu_type))
    if profile is None or instance.gpu_count < profile.gpu_count:
        return None
    return profile


def _pick(rng: np.random.Generator, weights: Mapping[str, float]) -> str:
    names = list(weights)
    p = np.asarray([weights[n] for n in names], dtype=np.float64)
    return names[int(rng.choice(len(names), p=p / p.sum()))]


def _shares(rng: np.random.Generator, names: Sequence[str], floor: float) -> dict[str, float]:
    """Random positive weights over names (a flat Dirichlet, each at least `floor`), summing
    to 1 and rounded to 3 decimals."""
    raw = np.maximum(rng.dirichlet(np.ones(len(names))), floor)
    raw = raw / raw.sum()
    return {n: round(float(w), 3) for n, w in zip(names, raw, strict=True)}


def draw_models(rng: np.random.Generator, max_models: int) -> list[str]:
    """1..max_models of the packaged models, in sorted order."""
    known = sorted({m for m, _ in fitting_profiles()})
    k = int(rng.integers(1, min(max_models, len(known)) + 1))
    return sorted(str(m) for m in rng.choice(known, size=k, replace=False))


def draw_streams(rng: np.random.Generator, models: Sequence[str]) -> list[StreamPlan]:
    """1-4 streams (the first never a backlog), each model named by at least one."""
    count = int(rng.integers(1, 5))
    shares = _shares(rng, [f"s{i}" for i in range(count)], 0.05)
    mixes = {m.name: m for m, _ in LENGTH_MIXES}
    mix_weights = {m.name: w for m, w in LENGTH_MIXES}
    streams = []
    for i in range(count):
        backlog = i > 0 and bool(rng.random() < 0.25)
        if rng.random() < 0.6 or len(models) == 1:
            stream_models = {models[int(rng.integers(len(models)))]: 1.0}
        else:
            stream_models = _shares(rng, models, 0.05)
        lengths = mixes[_pick(rng, mix_weights)]
        streams.append(
            StreamPlan(
                f"{'backlog' if backlog else 'stream'}{i}",
                backlog,
                shares[f"s{i}"],
                stream_models,
                _draw_classes(rng, backlog),
                lengths,
                _draw_shape(rng, backlog),
            )
        )
    return _cover_models(rng, streams, models)


def _draw_classes(rng: np.random.Generator, backlog: bool) -> dict[str, float]:
    """A random subset of the configured classes with random weights; a backlog draws only
    from the classes below the top priority (an interactive backlog is late by design)."""
    top = max(c.priority for c in DEFAULT_SLO_CLASSES)
    names = [c.name for c in DEFAULT_SLO_CLASSES if not (backlog and c.priority == top)]
    k = int(rng.integers(1, len(names) + 1))
    chosen = sorted(str(c) for c in rng.choice(names, size=k, replace=False))
    return _shares(rng, chosen, 0.05)


def _draw_shape(rng: np.random.Generator, backlog: bool) -> Shape:
    """Start (25%: in the first half of the window), gamma cv (0.5-3), bursts (40%: 1-2 at
    2-5x for 5-25% of the window) and a ramp (30%: to 0.25-4x the starting rate over 20-50%
    of the window)."""
    start = round(float(rng.uniform(0.0, 0.5)), 3) if rng.random() < 0.25 else 0.0
    if backlog:
        return Shape(start)
    cv = round(float(rng.uniform(0.5, 3)), 2)
    bursts: tuple[tuple[float, float, float], ...] = ()
    if rng.random() < 0.4:
        bursts = tuple(
            (
                round(float(rng.uniform(0.0, 0.8)), 3),
                round(float(rng.uniform(0.05, 0.25)), 3),
                round(float(rng.uniform(2.0, 5.0)), 2),
            )
            for _ in range(int(rng.integers(1, 3)))
        )
    ramp = None
    if rng.random() < 0.3:
        ramp_start = float(rng.uniform(0.0, 0.5))
        ramp_end = ramp_start + float(rng.uniform(0.2, 0.5))
        ratio = float(np.exp(rng.uniform(np.log(0.25), np.log(4.0))))
        ramp = (round(ramp_start, 3), round(ramp_end, 3), round(ratio, 3))
    return Shape(start, cv, bursts, ramp)


def _cover_models(
    rng: np.random.Generator, streams: list[StreamPlan], models: Sequence[str]
) -> list[StreamPlan]:
    """Add each model no stream names to a random stream's mix, with a random weight."""
    for model in models:
        if any(model in s.models for s in streams):
            continue
        i = int(rng.integers(len(streams)))
        mix = {**streams[i].models, model: round(float(rng.uniform(0.2, 1.0)), 3)}
        total = sum(mix.values())
        mix = {m: round(w / total, 3) for m, w in sorted(mix.items())}
        streams[i] = dataclasses.replace(streams[i], models=mix)
    return streams


def model_shares(streams: Sequence[StreamPlan]) -> dict[str, float]:
    """Each model's share of all requests."""
    out: dict[str, float] = {}
    for s in streams:
        total = sum(s.models.values())
        for m, w in s.models.items():
            out[m] = out.get(m, 0.0) + s.share * w / total
    norm = sum(out.values())
    return {m: v / norm for m, v in sorted(out.items())}


def draw_fleet(
    rng: np.random.Generator, models: Sequence[str], shares: Mapping[str, float], count: int
) -> list[InstancePlan]:
    """`count` instances over a random subset of the GPU types that can run the models: one
    per model first (so each model starts loaded somewhere), the rest with a model drawn by
    its share of the requests, each on a random type of the subset that fits it."""
    usable = sorted({g for (m, g) in fitting_profiles() if m in models})
    k = int(rng.integers(1, len(usable) + 1))
    types = sorted(str(g) for g in rng.choice(usable, size=k, replace=False))
    for model in models:  # every model needs a type of the subset that fits it
        if not any((model, g) in fitting_profiles() for g in types):
            types.append(next(g for g in usable if (model, g) in fitting_profiles()))
    initial = list(models) + [_pick(rng, shares) for _ in range(count - len(models))]
    fleet = []
    for model in initial:
        fits = [g for g in types if (model, g) in fitting_profiles()]
        gpu = fits[int(rng.integers(len(fits)))]
        fleet.append(InstancePlan(gpu, fitting_profiles()[(model, gpu)].gpu_count, model))
    return fleet
