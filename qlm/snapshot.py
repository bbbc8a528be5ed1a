"""A planning snapshot file: fleet, profiles and a synthetic queue, validated by pydantic.

Used by `qlm plan` (the embedded main job) to run grouping, estimation and planning once."""

from __future__ import annotations

import random
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field, model_validator

from qlm.config import QlmConfig
from qlm.perf.profile import GIB, Profile
from qlm.types import DEFAULT_GPU_TYPES, Fleet, Instance, Request, SloClass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProfileSpec(_Strict):
    model: str = Field(min_length=1)
    gpu_type: str = Field(min_length=1)
    gpu_count: int = Field(default=1, ge=1)
    weight_gb: float = Field(gt=0, description="Weights in GiB.")
    kv_kib_per_token: float = Field(gt=0)
    decode_batch_sizes: tuple[int, ...] = Field(min_length=1)
    decode_step_ms: tuple[float, ...] = Field(min_length=1)
    prefill_tokens_per_s: float = Field(gt=0)
    output_tokens_mean: float = Field(gt=0)
    output_tokens_std: float = Field(ge=0)
    load_s: float = Field(ge=0)
    max_batch_size: int = Field(default=256, ge=1)
    provenance: str = ""

    def to_profile(self) -> Profile:
        return Profile(
            model=self.model,
            gpu_type=self.gpu_type,
            gpu_count=self.gpu_count,
            weight_bytes=int(self.weight_gb * GIB),
            kv_bytes_per_token=int(self.kv_kib_per_token * 1024),
            decode_batch_sizes=self.decode_batch_sizes,
            decode_step_s=tuple(ms / 1000.0 for ms in self.decode_step_ms),
            prefill_tokens_per_s=self.prefill_tokens_per_s,
            output_tokens_mean=self.output_tokens_mean,
            output_tokens_std=self.output_tokens_std,
            load_s=self.load_s,
            max_batch_size=self.max_batch_size,
            provenance=self.provenance,
        )


class InstanceSpec(_Strict):
    id: str = Field(min_length=1, description="Id; with count > 1, a numeric suffix is added.")
    gpu_type: str = Field(min_length=1)
    gpu_count: int = Field(default=1, ge=1)
    loaded_model: str | None = None
    count: int = Field(default=1, ge=1, le=10_000)
    busy_s: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _known_gpu(self) -> InstanceSpec:
        if self.gpu_type not in DEFAULT_GPU_TYPES:
            raise ValueError(
                f"unknown gpu_type {self.gpu_type!r}; known: {sorted(DEFAULT_GPU_TYPES)}"
            )
        return self


class RequestBatchSpec(_Strict):
    """`count` requests of one model and SLO class arriving uniformly over `arrival_window_s`
    before the snapshot, with lognormal prompt lengths."""

    model: str = Field(min_length=1)
    slo_class: str = Field(min_length=1)
    count: int = Field(ge=1, le=1_000_000)
    prompt_tokens_median: int = Field(default=1000, ge=1)
    max_output_tokens: int = Field(default=512, ge=1)
    arrival_window_s: float = Field(default=10.0, ge=0)


class Snapshot(_Strict):
    now_s: float = 0.0
    seed: int = 0
    config: QlmConfig = Field(default_factory=QlmConfig)
    profiles: tuple[ProfileSpec, ...] = Field(min_length=1)
    instances: tuple[InstanceSpec, ...] = Field(min_length=1)
    requests: tuple[RequestBatchSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> Snapshot:
        models = {p.model for p in self.profiles}
        classes = {c.name for c in self.config.slo_classes}
        for i, batch in enumerate(self.requests):
            if batch.model not in models:
                raise ValueError(f"requests.{i}.model: {batch.model!r} has no profile")
            if batch.slo_class not in classes:
                raise ValueError(
                    f"requests.{i}.slo_class: {batch.slo_class!r} not in {sorted(classes)}"
                )
        return self

    def fleet(self) -> Fleet:
        return Fleet.of(self._instances(), (p.to_profile() for p in self.profiles))

    def busy_s(self) -> dict[str, float]:
        return {inst.id: spec.busy_s for spec, inst in self._expanded()}

    def _instances(self) -> Iterator[Instance]:
        return (inst for _, inst in self._expanded())

    def _expanded(self) -> Iterator[tuple[InstanceSpec, Instance]]:
        for spec in self.instances:
            memory = DEFAULT_GPU_TYPES[spec.gpu_type].memory_bytes
            for k in range(spec.count):
                inst_id = spec.id if spec.count == 1 else f"{spec.id}-{k}"
                yield (
                    spec,
                    Instance(inst_id, spec.gpu_type, spec.gpu_count, memory, spec.loaded_model),
                )

    def queued_requests(self) -> list[Request]:
        rng = random.Random(self.seed)
        classes: dict[str, SloClass] = self.config.slo_class_map()
        out: list[Request] = []
        for b, batch in enumerate(self.requests):
            for k in range(batch.count):
                arrival = self.now_s - rng.uniform(0.0, batch.arrival_window_s)
                prompt = max(1, int(rng.lognormvariate(0.0, 0.6) * batch.prompt_tokens_median))
                out.append(
                    Request.create(
                        f"r{b}-{k}",
                        batch.model,
                        prompt,
                        batch.max_output_tokens,
                        classes[batch.slo_class],
                        arrival,
                    )
                )
        return out
