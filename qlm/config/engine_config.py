"""How one engine model schedules: its token budget, preemption mode and swap space.

Question answered: what can be set on the engine model's scheduler? (vLLM's SchedulerConfig,
reduced.) One validated, frozen config per engine; the fields say their ranges.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from qlm.config import StrictModel

PreemptionMode = Literal["recompute", "swap"]
WaitingOrder = Literal["fcfs", "prefix-groups", "srpt-mlfq"]


class EngineConfig(StrictModel):
    """Scheduler settings of one engine (vLLM's SchedulerConfig, reduced)."""

    chunk_tokens: int = Field(
        default=2048,
        ge=1,
        description="Token budget per iteration (vLLM max_num_batched_tokens): one per "
        "decoding sequence plus prefill chunks; max_num_seqs is capped at it.",
    )
    preemption_mode: PreemptionMode = Field(
        default="recompute",
        description="What happens to a sequence preempted for KV room: 'recompute' drops its "
        "KV and requeues it; 'swap' moves its KV to CPU (recompute when CPU space is full).",
    )
    cpu_swap_tokens: int = Field(
        default=0,
        ge=0,
        description="KV tokens that fit in CPU swap space; 0 means no KV swapping "
        "(swap_out raises EngineError).",
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, description="Sequences running at once; None: the profile's."
    )
    swap_bytes_per_s: float = Field(
        default=16e9,
        gt=0,
        description="GPU<->CPU bandwidth for KV swaps; transfers lengthen the next iteration.",
    )
    waiting_order: WaitingOrder = Field(
        default="fcfs",
        description="Order in which waiting requests are admitted: 'fcfs' (vLLM's default); "
        "'prefix-groups' (Preble's local scheduler: priority groups by the share of the prompt "
        "the prefix cache holds, each admitted in proportion to its priority, so requests "
        "that hit much go first yet those that hit little are not starved); 'srpt-mlfq' "
        "(Prophet, as the native engine's local policy of that name: prompt chunks of "
        "running and waiting requests shortest remaining first, those waiting "
        "max_wait_iterations or more first; the preemption victim is the most served "
        "request by a multi-level feedback queue on tokens generated).",
    )
    prefix_groups: int = Field(
        default=10, ge=1, le=100, description="Priority groups of 'prefix-groups' (Preble's P)."
    )

    max_wait_iterations: int = Field(
        default=64,
        ge=1,
        description="Starvation bound of srpt-mlfq and prefix-groups: a request waiting "
        "this many iterations since it arrived goes before shorter or better cached ones.",
    )
    mlfq_quantum_tokens: int = Field(
        default=16,
        ge=1,
        description="srpt-mlfq's feedback levels: level floor(log2(1 + output / quantum)).",
    )

    standby_models: int = Field(
        default=0,
        ge=0,
        description="Models an instance keeps asleep beside the one it serves (weights in host "
        "memory: vLLM sleep mode level 1, or co-resident standby servers): loading one takes "
        "the profile's wake_s instead of load_s; the least recently served goes cold when "
        "the tier is full (qlm/engine/model/tiers.py). 0: every load is cold.",
    )

    @model_validator(mode="after")
    def _swap_needs_space(self) -> EngineConfig:
        if self.preemption_mode == "swap" and self.cpu_swap_tokens == 0:
            raise ValueError("preemption_mode 'swap' needs cpu_swap_tokens > 0")
        return self

    @property
    def supports_kv_swap(self) -> bool:
        return self.cpu_swap_tokens > 0


__all__ = ["EngineConfig", "PreemptionMode", "WaitingOrder"]
