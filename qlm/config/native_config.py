"""The native engine's settings in the fleet file (`engine: {kind: native, native: {...}}`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from qlm.config import StrictModel

GIB = 1 << 30


class NativeEngineConfig(StrictModel):
    models: dict[str, Path] = Field(
        min_length=1,
        description="Model name -> checkpoint folder (Hugging Face layout: config.json, "
        "*.safetensors, and tokenizer.json for text prompts).",
    )
    kv_cache_gib: float = Field(default=0.25, gt=0, description="KV cache size, float32.")
    block_size: int = Field(default=16, ge=1, description="Token slots per KV block.")
    max_num_seqs: int = Field(default=64, ge=1)
    max_batched_tokens: int = Field(
        default=2048, ge=1, description="Tokens one step computes (prompt chunks + decodes)."
    )
    policy: Literal["fcfs", "srpt-mlfq", "prefix-groups"] = Field(
        default="fcfs", description="Local scheduling (qlm/engine/native/local_policy.py)."
    )
    prefix_groups: int = Field(
        default=10, ge=1, le=100, description="prefix-groups' priority groups (Preble's P)."
    )
    max_wait_steps: int = Field(
        default=64, ge=1, description="Starvation bound (steps) of srpt-mlfq and prefix-groups."
    )
    shared_prefix: bool = Field(
        default=True, description="Read a prefix shared by forks once per step."
    )
    prefix_caching: bool = Field(
        default=True,
        description="Keep full KV blocks after their requests end; a request starting with "
        "the same tokens takes them back instead of computing them.",
    )
    torch_threads: int | None = Field(
        default=None, ge=1, description="torch's CPU threads (None: torch's default)."
    )
    stream_every_steps: int = Field(
        default=1, ge=1, description="Stream new tokens every this many steps."
    )
    filler_token_id: int = Field(
        default=0,
        ge=0,
        description="Requests without text (QLM's own tests and benchmarks give only a token "
        "count) are this token repeated.",
    )

    def kv_cache_bytes(self) -> int:
        return int(self.kv_cache_gib * GIB)
