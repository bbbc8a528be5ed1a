"""Factories for tests: small profiles, fleets, requests and groups with readable defaults."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from qlm.grouping.group import RequestGroup
from qlm.perf.profile import GIB, Profile
from qlm.types import Instance, Request

_ids: Iterator[int] = itertools.count()


def make_profile(
    model: str = "m7b",
    gpu_type: str = "A100",
    *,
    gpu_count: int = 1,
    weight_gib: float = 14.0,
    kv_kib_per_token: float = 128.0,
    step_s: tuple[float, ...] = (0.02, 0.025, 0.04),
    batch_sizes: tuple[int, ...] = (1, 16, 64),
    prefill_tokens_per_s: float = 10_000.0,
    output_mean: float = 200.0,
    output_std: float = 150.0,
    load_s: float = 10.0,
    max_batch_size: int = 64,
    min_kv_tokens: int = 4096,
) -> Profile:
    return Profile(
        model=model,
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        weight_bytes=int(weight_gib * GIB),
        kv_bytes_per_token=int(kv_kib_per_token * 1024),
        decode_batch_sizes=batch_sizes,
        decode_step_s=step_s,
        prefill_tokens_per_s=prefill_tokens_per_s,
        output_tokens_mean=output_mean,
        output_tokens_std=output_std,
        load_s=load_s,
        max_batch_size=max_batch_size,
        min_kv_tokens=min_kv_tokens,
    )


def make_instance(
    id: str = "i0",
    gpu_type: str = "A100",
    *,
    gpu_count: int = 1,
    memory_gib: float = 80.0,
    loaded_model: str | None = "m7b",
) -> Instance:
    return Instance(id, gpu_type, gpu_count, int(memory_gib * GIB), loaded_model)


def make_request(
    *,
    model: str = "m7b",
    prompt_tokens: int = 500,
    max_output_tokens: int = 512,
    slo_class: str = "interactive",
    arrival_at_s: float = 0.0,
    ttft_s: float = 20.0,
    completion_s: float | None = None,
    id: str | None = None,
) -> Request:
    return Request(
        id=id or f"r{next(_ids)}",
        model=model,
        prompt_tokens=prompt_tokens,
        max_output_tokens=max_output_tokens,
        slo_class=slo_class,
        arrival_at_s=arrival_at_s,
        ttft_deadline_at_s=arrival_at_s + ttft_s,
        completion_deadline_at_s=None if completion_s is None else arrival_at_s + completion_s,
    )


def make_group(
    id: str = "g0",
    *,
    size: int = 10,
    model: str = "m7b",
    slo_class: str = "interactive",
    deadline_at_s: float = 20.0,
    prompt_tokens: float = 500.0,
    output_cap: float = 512.0,
    completion_deadline_at_s: float | None = None,
    first_arrival_at_s: float = 0.0,
) -> RequestGroup:
    return RequestGroup(
        id=id,
        model=model,
        slo_class=slo_class,
        request_ids=tuple(f"{id}.{i}" for i in range(size)),
        prompt_tokens_mean=prompt_tokens,
        output_cap_mean=output_cap,
        ttft_deadline_at_s=deadline_at_s,
        completion_deadline_at_s=completion_deadline_at_s,
        first_arrival_at_s=first_arrival_at_s,
    )


def group_of(requests: Sequence[Request], id: str = "g") -> RequestGroup:
    return RequestGroup.of(id, requests)
