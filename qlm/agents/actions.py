"""LSOs as frozen values: what an agent asks its engine to do."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class Pull:
    """Admit queued requests into the engine."""

    instance_id: str
    request_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Evict:
    """Preempt running requests and return them to the global queue."""

    instance_id: str
    request_ids: tuple[str, ...]
    reason: str


class KvDirection(StrEnum):
    TO_CPU = "to_cpu"
    TO_GPU = "to_gpu"


@dataclass(frozen=True, slots=True)
class SwapKv:
    """Move requests' KV cache between GPU and CPU memory."""

    instance_id: str
    request_ids: tuple[str, ...]
    direction: KvDirection


@dataclass(frozen=True, slots=True)
class LoadModel:
    """Switch the instance to another model; it serves nothing meanwhile."""

    instance_id: str
    model: str


Action = Pull | Evict | SwapKv | LoadModel
