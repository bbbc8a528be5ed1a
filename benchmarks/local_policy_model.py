"""The engine model's half of benchmarks/local_policy.py: the same arrivals served by the
simulator's engine model (qlm/engine/model/core.py) with the same local orders, its step time
fitted to the native runner's own steps, so simulated and native ratios sit side by side.

`fit_step_time` times native runner steps of known shapes (prompt chunks of 32-256 tokens,
decode batches of 1-8 sequences over 64-1,024 tokens of context each) and fits the engine
model's linear iteration time (qlm/perf/step.py) by least squares; `serve_model` replays one
seed's arrivals on an `EngineModel` and returns what `local_policy.serve` returns."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from qlm.config.engine_config import EngineConfig
from qlm.engine.engine_types import FirstToken, RequestFinished
from qlm.engine.model.core import EngineModel
from qlm.engine.native.checkpoint import load_checkpoint
from qlm.engine.native.paged_sequence import Sampling
from qlm.engine.native.runner_config import RunnerConfig
from qlm.engine.native.step_runner import NativeRunner
from qlm.perf.profile import Profile
from qlm.perf.step import StepTime
from qlm.types import Instance, Request


class ArrivalLike(Protocol):
    @property
    def request_id(self) -> str: ...
    @property
    def at_s(self) -> float: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...


def _timed_steps(runner: NativeRunner, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        runner.step()
    return (time.perf_counter() - started) / steps


def _samples(path: Path, config: RunnerConfig) -> list[tuple[float, float, float, float]]:
    """(prefill tokens, decode sequences, context tokens, seconds) per timed step shape."""
    checkpoint = load_checkpoint(path)
    samples = []
    greedy = Sampling(max_tokens=1, temperature=0.0, ignore_eos=True)
    for prompt in (32, 64, 128, 256):
        runner = NativeRunner(checkpoint, config)
        for k in range(6):
            runner.add(f"p{k}", [(k + i) % 50 + 1 for i in range(prompt)], greedy)
        _timed_steps(runner, 1)  # warm
        samples.append((prompt, 0.0, prompt, _timed_steps(runner, 4)))
    for batch in (1, 4, 8):
        for context in (64, 512, 1024):
            runner = NativeRunner(checkpoint, config)
            long = Sampling(max_tokens=64, temperature=0.0, ignore_eos=True)
            for k in range(batch):
                runner.add(f"d{k}", [(k + i) % 50 + 1 for i in range(context)], long)
            while any(s.pending > 1 for s in runner.running) or runner.waiting:
                runner.step()
            samples.append((0, batch, batch * (context + 8), _timed_steps(runner, 8)))
    return samples


def fit_step_time(path: Path, config: RunnerConfig) -> StepTime:
    """The engine model's iteration time fitted to the native runner's steps."""
    rows = _samples(path, config)
    features = np.array([[1.0, p, d, c] for p, d, c, _ in rows])
    seconds = np.array([s for *_, s in rows])
    coef, *_ = np.linalg.lstsq(features, seconds, rcond=None)
    base, prefill, decode, context = (float(max(v, 1e-9)) for v in coef)
    return StepTime(base, prefill, decode, context)


def _profile(model: str, step_time: StepTime, max_num_seqs: int) -> Profile:
    return Profile(
        model=model,
        gpu_type="cpu",
        gpu_count=1,
        weight_bytes=1,
        kv_bytes_per_token=1,
        decode_batch_sizes=(1, max_num_seqs),
        decode_step_s=(step_time.decode_step_s(1, 512), step_time.decode_step_s(8, 512)),
        prefill_tokens_per_s=1.0 / step_time.per_prefill_token_s,
        output_tokens_mean=16.0,
        output_tokens_std=8.0,
        load_s=1.0,
        max_batch_size=max_num_seqs,
        min_kv_tokens=1,
        gpu_memory_utilization=1.0,
        step_time=step_time,
    )


def serve_model(
    arrivals: Sequence[ArrivalLike],
    model: str,
    step_time: StepTime,
    config: EngineConfig,
    kv_tokens: int,
) -> dict[str, Any]:
    """One seed's arrivals on the engine model: TTFT per request id and the makespan."""
    max_seqs = config.max_num_seqs or 8
    engine = EngineModel(
        Instance("model", "cpu", 1, kv_tokens + 1, model),
        [_profile(model, step_time, max_seqs)],
        config,
    )
    events = []
    for a in sorted(arrivals, key=lambda a: a.at_s):
        events += engine.advance_to(a.at_s)
        request = Request(
            a.request_id, model, a.prompt_tokens, a.output_tokens, "batch-1", a.at_s, 1e9
        )
        engine.add(request, a.at_s)
    events += engine.advance_to(1e9)
    at = {a.request_id: a.at_s for a in arrivals}
    ttft = {e.request_id: e.at_s - at[e.request_id] for e in events if isinstance(e, FirstToken)}
    ends = [e.at_s for e in events if isinstance(e, RequestFinished)]
    assert len(ends) == len(arrivals), "the engine model lost a request"
    return {"ttft_s": ttft, "makespan_s": max(ends)}
