"""The shared vocabulary: requests and their lifecycle, SLO classes, instances, fleets.

All types are frozen; a change of state makes a new value through a checked transition.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import NamedTuple

from qlm.perf.profile import GIB, Profile


class RequestState(StrEnum):
    QUEUED = "queued"  # in the global queue, planned or not
    DISPATCHED = "dispatched"  # pulled into an engine, not yet producing tokens
    RUNNING = "running"  # producing tokens
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({RequestState.COMPLETED, RequestState.CANCELLED, RequestState.FAILED})

# The one transition table. Eviction is RUNNING/DISPATCHED -> QUEUED.
TRANSITIONS: Mapping[RequestState, frozenset[RequestState]] = MappingProxyType(
    {
        RequestState.QUEUED: frozenset(
            {RequestState.DISPATCHED, RequestState.CANCELLED, RequestState.FAILED}
        ),
        RequestState.DISPATCHED: frozenset(
            {
                RequestState.RUNNING,
                RequestState.QUEUED,
                RequestState.CANCELLED,
                RequestState.FAILED,
            }
        ),
        RequestState.RUNNING: frozenset(
            {
                RequestState.COMPLETED,
                RequestState.QUEUED,
                RequestState.CANCELLED,
                RequestState.FAILED,
            }
        ),
        RequestState.COMPLETED: frozenset(),
        RequestState.CANCELLED: frozenset(),
        RequestState.FAILED: frozenset(),
    }
)


class IllegalTransitionError(ValueError):
    def __init__(self, request_id: str, src: RequestState, dst: RequestState) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[src])) or "none (terminal)"
        super().__init__(
            f"request {request_id}: illegal transition {src} -> {dst}; "
            f"allowed from {src}: {allowed}"
        )


@dataclass(frozen=True, slots=True)
class SloClass:
    """A named latency target. ttft_s is relative to arrival; completion_s is optional."""

    name: str
    ttft_s: float
    completion_s: float | None = None
    lateness_weight: float = 1.0  # planner penalty per request-second late
    priority: int = 0  # larger is more urgent; eviction picks lower priorities first

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("SLO class name must not be empty")
        if not (0 < self.ttft_s < math.inf):
            raise ValueError(f"SLO class {self.name}: ttft_s must be a positive finite number")
        if self.completion_s is not None and self.completion_s < self.ttft_s:
            raise ValueError(f"SLO class {self.name}: completion_s must be >= ttft_s")
        if self.lateness_weight < 0:
            raise ValueError(f"SLO class {self.name}: lateness_weight must be >= 0")


# Defaults as in the QLM paper (TTFT targets).
DEFAULT_SLO_CLASSES: tuple[SloClass, ...] = (
    SloClass("interactive", ttft_s=20.0, lateness_weight=100.0, priority=2),
    SloClass("batch-1", ttft_s=60.0, lateness_weight=10.0, priority=1),
    SloClass("batch-2", ttft_s=3600.0, lateness_weight=1.0, priority=0),
)


class PrefixBlock(NamedTuple):
    """A run of a prompt's leading tokens that other prompts may share. `key` names the
    prompt from its start up to the end of this block (equal keys: equal text so far, so a
    block is only ever reused behind the same blocks); `tokens` is the block's length."""

    key: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Request:
    """One generation request. Times are absolute seconds on the control plane's clock."""

    id: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    slo_class: str
    arrival_at_s: float
    ttft_deadline_at_s: float
    completion_deadline_at_s: float | None = None
    tenant: str = "default"
    prompt: str | None = None
    state: RequestState = RequestState.QUEUED
    # The client's sampling and output settings, passed to the engine as given (temperature,
    # top_p, stop, seed, ignore_eos, and the output fields of qlm/engine/openai_fields.py the
    # fleet's engines honour); plain JSON values. Not part of the request's identity.
    sampling: dict[str, object] = field(default_factory=dict, hash=False, compare=False)
    # A chat request's messages as the client sent them, for engines that apply the model's
    # own chat template (vLLM's chat endpoint); `prompt` holds their flattened text. None for
    # completions and for engines that take text.
    messages: list[dict[str, object]] | None = field(default=None, hash=False, compare=False)
    # The API's prediction at admission (qlm/api/wait_estimate.py): seconds from arrival to
    # the first token, and what it rests on ("schedule", "late", "plan", "idle", "no-plan").
    # None and "" for requests that did not come through the API (simulated ones).
    estimated_wait_s: float | None = field(default=None, hash=False, compare=False)
    estimate_basis: str = field(default="", hash=False, compare=False)
    # Seconds from arrival to the predicted end of the output; None where nothing is known
    # (a "no-plan" estimate, or an "idle" one for a model no live instance can serve).
    estimated_completion_s: float | None = field(default=None, hash=False, compare=False)
    # A "schedule" wait's bound for nine requests in ten (qlm/estimator/forecast_band.py);
    # None until the API has learnt one, and for other bases.
    estimated_wait_p90_s: float | None = field(default=None, hash=False, compare=False)
    # The prompt's leading blocks that other prompts may share, in prompt order (their tokens
    # add up to at most prompt_tokens; the rest of the prompt is its own). Engines with a
    # prefix cache compute only what they do not hold (qlm/prefixes/cache.py).
    prefix: tuple[PrefixBlock, ...] = field(default=(), hash=False, compare=False)
    # A batch job's plan (qlm/prefixes/job_plan.py): the part of the job it is planned in (the
    # group the planner places) and its key in the job's serving order. None outside jobs.
    job_group: str | None = field(default=None, hash=False, compare=False)
    job_order: str | None = field(default=None, hash=False, compare=False)
    # The first request of its part, which computes the part's shared prefix: this one starts
    # on the same engine only once that one's prefill is done. None for leaders.
    job_leader: str | None = field(default=None, hash=False, compare=False)

    @property
    def ignores_eos(self) -> bool:
        """The client asked to generate max_output_tokens even past end-of-sequence."""
        return self.sampling.get("ignore_eos") is True

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"request {self.id}: prompt_tokens must be >= 1")
        if self.max_output_tokens < 1:
            raise ValueError(f"request {self.id}: max_output_tokens must be >= 1")
        if self.ttft_deadline_at_s < self.arrival_at_s:
            raise ValueError(f"request {self.id}: ttft deadline before arrival")
        if (
            self.completion_deadline_at_s is not None
            and self.completion_deadline_at_s < self.ttft_deadline_at_s
        ):
            raise ValueError(f"request {self.id}: completion deadline before ttft deadline")
        if self.prefix and (
            any(block.tokens < 1 for block in self.prefix)
            or sum(block.tokens for block in self.prefix) > self.prompt_tokens
        ):
            raise ValueError(
                f"request {self.id}: prefix blocks must hold >= 1 token each and at most "
                "prompt_tokens in all"
            )

    @classmethod
    def create(
        cls,
        id: str,
        model: str,
        prompt_tokens: int,
        max_output_tokens: int,
        slo: SloClass,
        arrival_at_s: float,
        tenant: str = "default",
        prompt: str | None = None,
        prefix: tuple[PrefixBlock, ...] = (),
    ) -> Request:
        """A queued request whose deadlines follow from its SLO class."""
        completion_at_s = None if slo.completion_s is None else arrival_at_s + slo.completion_s
        return cls(
            id=id,
            model=model,
            prompt_tokens=prompt_tokens,
            max_output_tokens=max_output_tokens,
            slo_class=slo.name,
            arrival_at_s=arrival_at_s,
            ttft_deadline_at_s=arrival_at_s + slo.ttft_s,
            completion_deadline_at_s=completion_at_s,
            tenant=tenant,
            prompt=prompt,
            prefix=prefix,
        )

    @property
    def ttft_slo_s(self) -> float:
        return self.ttft_deadline_at_s - self.arrival_at_s

    def transition(self, to: RequestState) -> Request:
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransitionError(self.id, self.state, to)
        return replace(self, state=to)


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    memory_bytes: int  # per GPU
    cost_per_hour: float = 0.0


DEFAULT_GPU_TYPES: Mapping[str, GpuType] = MappingProxyType(
    {
        "A10": GpuType("A10", 24 * GIB, 1.0),
        "A100": GpuType("A100", 80 * GIB, 3.7),
        "H100": GpuType("H100", 80 * GIB, 6.9),
    }
)


class InstanceRole(StrEnum):
    """What an engine does with a request (Prophet's and DistServe's prefill/decode split)."""

    BOTH = "both"  # prefill and decode, co-located (every live engine)
    PREFILL = "prefill"  # hands a request's KV to a decode engine after its first token
    DECODE = "decode"  # takes handed-off requests (and fresh ones, if a router sends them)


DEFAULT_KV_LINK_BYTES_PER_S = 25e9  # 200 Gb/s: one RDMA NIC per engine


@dataclass(frozen=True, slots=True)
class Instance:
    """One engine: one model loaded at a time, on gpu_count GPUs of one type (or on a slice of
    them: `device` names the GPUs that `slices` engines share, each with its memory share in
    gpu_memory_bytes, taking turns on their compute)."""

    id: str
    gpu_type: str
    gpu_count: int
    gpu_memory_bytes: int  # per GPU: this engine's share of it
    loaded_model: str | None = None
    # Models asleep on it (the standby tier, qlm/engine/model/tiers.py): they wake in the
    # profile's wake_s instead of loading in load_s.
    standby_models: tuple[str, ...] = ()
    standby_capacity: int = 0  # models the tier holds at most (the one it leaves sleeps)
    slices: int = 1  # engines sharing these GPUs (this one included)
    device: str | None = None  # the GPUs' name when shared (slices > 1)
    kv_pool: bool = False  # the sharers draw KV from one pool (weights stay in their share)
    role: InstanceRole = InstanceRole.BOTH  # the simulator's prefill/decode split
    kv_link_bytes_per_s: float = DEFAULT_KV_LINK_BYTES_PER_S  # where handed-off KV travels

    def __post_init__(self) -> None:
        if self.gpu_count < 1:
            raise ValueError(f"instance {self.id}: gpu_count must be >= 1")
        if self.gpu_memory_bytes <= 0:
            raise ValueError(f"instance {self.id}: gpu_memory_bytes must be > 0")
        if self.slices < 1 or (self.slices > 1) != (self.device is not None):
            raise ValueError(f"instance {self.id}: a device is named iff slices > 1")
        if self.kv_pool and self.device is None:
            raise ValueError(f"instance {self.id}: a KV pool needs shared GPUs (slices > 1)")
        if self.kv_link_bytes_per_s <= 0:
            raise ValueError(f"instance {self.id}: kv_link_bytes_per_s must be > 0")

    @property
    def gpus(self) -> float:
        """GPUs this engine accounts for: its share of those it runs on."""
        return self.gpu_count / self.slices


@dataclass(frozen=True)
class Fleet:
    """The instances and the profiles that say what each can serve and how fast."""

    instances: tuple[Instance, ...]
    profiles: Mapping[tuple[str, str], Profile] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = [i.id for i in self.instances]
        if len(ids) != len(set(ids)):
            raise ValueError("instance ids must be unique")
        object.__setattr__(self, "profiles", MappingProxyType(dict(self.profiles)))

    @classmethod
    def of(cls, instances: Iterable[Instance], profiles: Iterable[Profile]) -> Fleet:
        return cls(tuple(instances), {p.key: p for p in profiles})

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted({model for model, _ in self.profiles}))

    def profile(self, model: str, instance: Instance) -> Profile | None:
        return self.profiles.get((model, instance.gpu_type))

    def can_serve(self, instance: Instance, model: str) -> bool:
        """True when a profile exists and weights plus minimum KV fit the instance."""
        profile = self.profile(model, instance)
        return (
            profile is not None
            and instance.gpu_count >= profile.gpu_count
            and profile.fits(instance.gpu_memory_bytes)
        )

    def instance(self, instance_id: str) -> Instance:
        for inst in self.instances:
            if inst.id == instance_id:
                return inst
        raise KeyError(f"unknown instance {instance_id!r}")
