"""An instance group of the fleet (`fleet.instances[i]`, qlm/config/fleet_config.py): `count`
instances of one GPU type with the same initial model, and how engines share their GPUs
(`slices`, `slice_memory`, `kv_pool`; the simulator's qlm/sim/sharing.py), and what they do
(`role`, `kv_link_gb_per_s`: the simulator's prefill/decode split, qlm/sim/handoff.py)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Annotated

from pydantic import Field

from qlm.config import StrictModel
from qlm.types import DEFAULT_KV_LINK_BYTES_PER_S, InstanceRole


class InstanceGroupConfig(StrictModel):
    """`count` instances of one GPU type with the same initial model. count 0 keeps the
    group as a template (`qlm capacity`, Scenario.with_fleet_counts)."""

    moved_fields = MappingProxyType(
        {
            "loaded_model": "renamed to model",
            "busy_s": "a snapshot's busy_s is a top-level map, busy_s: {<instance or group id>: "
            "seconds}",
        }
    )

    id: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="The instance's id when count is 1, else the prefix of <id>-0, <id>-1, ...; "
        "default: <gpu type, lower case>-<model>, always numbered.",
    )
    gpu_type: str = Field(min_length=1, description="A10, A100, H100 or one of gpu_types.")
    count: int = Field(default=1, ge=0, le=100_000, description="Instances in the group.")
    model: str | None = Field(
        default=None, min_length=1, description="Model loaded at the start; none: idle."
    )
    gpu_count: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="GPUs per instance; default: the model's profile's, else 1.",
    )
    slices: int = Field(
        default=1,
        ge=1,
        le=8,
        description="Engines sharing each instance's GPUs: every one holds its own model in "
        "1/slices of their memory, and they take turns on the compute when several are busy "
        "(several models active on one GPU). The simulator and `qlm plan` honour it; the "
        "live plane refuses it. The engine with the smallest share that fits `model` starts "
        "with it (best fit: larger shares stay free for larger models), the others idle.",
    )
    slice_memory: tuple[Annotated[float, Field(gt=0, le=1)], ...] | None = Field(
        default=None,
        description="With slices > 1: each engine's share of the GPU memory, one per slice "
        "(they add up to 1 at most; e.g. [0.5, 0.25, 0.25]: one engine that holds a 13B "
        "model beside two that hold 7B ones); default: 1/slices each.",
    )
    kv_pool: bool = Field(
        default=False,
        description="With slices > 1: the engines of a GPU draw their KV cache from one pool "
        "(as kvcached pools it), each free token shared among those holding a model, while "
        "their weights stay in their own share; false: each has only its share's KV.",
    )

    role: InstanceRole = Field(
        default=InstanceRole.BOTH,
        description="prefill: each request's KV goes to a decode instance of its model after "
        "its first token; decode: takes those requests (and fresh ones a router sends); both: "
        "co-located (Prophet's and DistServe's prefill/decode split, qlm/sim/handoff.py). The "
        "simulator honours it; the live plane refuses anything but both.",
    )
    kv_link_gb_per_s: float = Field(
        default=DEFAULT_KV_LINK_BYTES_PER_S / 1e9,
        gt=0,
        le=10_000,
        description="Gigabytes per second each instance of the group sends or receives "
        "handed-off KV at (a transfer takes the KV's bytes, from the model's profile, over the "
        "slower end's link); default 25 (200 Gb/s RDMA).",
    )

    @property
    def prefix(self) -> str:
        if self.id is not None:
            return self.id
        return f"{self.gpu_type.lower()}-{self.model}" if self.model else self.gpu_type.lower()

    def devices(self) -> list[tuple[str, list[str]]]:
        """(name of the GPUs, ids of the engines on them) per instance of the group: one
        engine named like its GPUs, or `<name>-s0` .. `<name>-s<slices-1>`."""
        names = [self.id] if self.id is not None and self.count == 1 else None
        names = names or [f"{self.prefix}-{k}" for k in range(self.count)]
        if self.slices == 1:
            return [(name, [name]) for name in names]
        return [(name, [f"{name}-s{j}" for j in range(self.slices)]) for name in names]

    def instance_ids(self) -> list[str]:
        return [engine for _, engines in self.devices() for engine in engines]
