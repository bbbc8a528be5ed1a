"""Engine test helpers: profiles with an exact KV capacity, engines, event bookkeeping."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import replace

from qlm.config.engine_config import EngineConfig
from qlm.engine.engine_types import Aborted, EngineError, EngineEvent, FirstToken, RequestFinished
from qlm.engine.model.core import EngineModel
from qlm.perf.profile import Profile
from qlm.perf.step import StepTime
from qlm.types import Instance, Request

# A readable step model: 10 ms per iteration, 0.1 ms per prefill token, 1 ms per decoding
# sequence, 1 us per context token.
STEP = StepTime(
    base_s=0.010, per_prefill_token_s=1e-4, per_decode_seq_s=1e-3, per_context_token_s=1e-6
)


def exact_profile(
    model: str = "m",
    *,
    step_time: StepTime | None = STEP,
    max_batch_size: int = 64,
    load_s: float = 5.0,
    gpu_type: str = "G",
) -> Profile:
    """A profile whose KV capacity on exact_instance(capacity) is exactly `capacity` tokens
    (1 byte of weights, 1 byte of KV per token, all memory usable)."""
    return Profile(
        model=model,
        gpu_type=gpu_type,
        gpu_count=1,
        weight_bytes=1,
        kv_bytes_per_token=1,
        decode_batch_sizes=(1, 64),
        decode_step_s=(0.011, 0.074),
        prefill_tokens_per_s=10_000.0,
        output_tokens_mean=100.0,
        output_tokens_std=50.0,
        load_s=load_s,
        max_batch_size=max_batch_size,
        min_kv_tokens=1,
        gpu_memory_utilization=1.0,
        step_time=step_time,
    )


def exact_instance(
    capacity_tokens: int, loaded_model: str | None = "m", gpu_type: str = "G"
) -> Instance:
    return Instance("e0", gpu_type, 1, capacity_tokens + 1, loaded_model)


def engine(
    capacity_tokens: int = 100_000,
    *,
    profiles: Iterable[Profile] | None = None,
    config: EngineConfig | None = None,
    loaded_model: str | None = "m",
) -> EngineModel:
    return EngineModel(
        exact_instance(capacity_tokens, loaded_model),
        list(profiles) if profiles is not None else [exact_profile()],
        config,
    )


def req(
    id: str, prompt: int = 100, output: int = 10, at_s: float = 0.0, model: str = "m"
) -> Request:
    return Request(
        id=id,
        model=model,
        prompt_tokens=prompt,
        max_output_tokens=output,
        slo_class="interactive",
        arrival_at_s=at_s,
        ttft_deadline_at_s=at_s + 20.0,
    )


def run_all(model: EngineModel, until_s: float = 1e9) -> list[EngineEvent]:
    return model.advance_to(until_s)


def first_tokens(events: Iterable[EngineEvent]) -> dict[str, float]:
    return {e.request_id: e.at_s for e in events if isinstance(e, FirstToken)}


def finishes(events: Iterable[EngineEvent]) -> dict[str, RequestFinished]:
    return {e.request_id: e for e in events if isinstance(e, RequestFinished)}


def aborted(events: Iterable[EngineEvent]) -> dict[str, Aborted]:
    return {e.request_id: e for e in events if isinstance(e, Aborted)}


# ---------------------------------------------------------------- random operations

OPERATIONS = ("add", "add", "add", "abort", "swap_out", "swap_in", "load", "wait")


def conservation_engine(mode: str, waiting_order: str = "fcfs") -> EngineModel:
    """The engine the random-operation tests drive: 1,000 KV tokens, 800 of CPU swap space,
    8 slots, two models it can switch between."""
    config = EngineConfig.model_validate(
        {
            "chunk_tokens": 256,
            "preemption_mode": mode,
            "cpu_swap_tokens": 800,
            "max_num_seqs": 8,
            "waiting_order": waiting_order,
        }
    )
    return EngineModel(
        exact_instance(1000),
        [exact_profile("m", load_s=0.5), exact_profile("n", load_s=0.2)],
        config,
    )


def apply_operation(
    model: EngineModel, op: str, request: Request, at_s: float, added: set[str]
) -> None:
    """One of OPERATIONS on the request at at_s (added once, for the model loaded or being
    loaded; swap_out may refuse)."""
    current = model.model or "m"
    request_id = request.id
    if op == "add" and request_id not in added:
        model.add(replace(request, model=current), at_s)
        added.add(request_id)
    elif op == "abort":
        model.abort([request_id], at_s)
    elif op == "swap_out":
        with contextlib.suppress(EngineError):
            model.swap_out([request_id], at_s)
    elif op == "swap_in":
        model.swap_in([request_id], at_s)
    elif op == "load":
        model.load("n" if current == "m" else "m", at_s)
