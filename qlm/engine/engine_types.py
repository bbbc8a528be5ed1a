"""What an engine reports: its state, the requests it holds, its events and its errors.

Question answered: what does an agent (or the simulator) see of one engine? Plain frozen data
and no I/O, so the pure reconcile step (qlm/agents/reconcile.py), the engine model and the
simulator import it without an event loop. How an engine is driven (the EngineClient protocol,
EventBuffer for live engines) is in client.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple


class EngineState(StrEnum):
    EMPTY = "empty"  # no model loaded
    LOADING = "loading"  # loading or swapping a model; serves nothing
    READY = "ready"  # a model is loaded and requests run
    FAILED = "failed"  # the engine died; the agent restarts it or gives up


class EngineRequest(NamedTuple):
    """A request the engine holds, as the agent's reconcile step needs to see it. A named
    tuple, not a frozen dataclass: every observation makes one per request it lists, and a
    tuple is made several times faster."""

    request_id: str
    slo_class: str
    prompt_tokens: int
    max_output_tokens: int
    output_tokens: int  # generated so far
    started: bool  # produced its first token
    kv_on_cpu: bool = False  # swapped out; neither running nor holding GPU KV

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class EngineObservation:
    """What the engine looks like now. `requests` holds every request the engine has admitted
    and not finished: running, waiting inside the engine, or swapped to CPU."""

    instance_id: str
    state: EngineState
    model: str | None
    requests: tuple[EngineRequest, ...]
    kv_used_tokens: int
    kv_capacity_tokens: int
    max_num_seqs: int
    supports_kv_swap: bool = False
    at_s: float = 0.0
    # Since the engine started: prompt tokens it admitted with a prefix, and of those, found
    # in its prefix cache (qlm/prefixes/cache.py). None: the engine does not say.
    prefix_prompt_tokens: int | None = None
    prefix_hit_tokens: int | None = None
    standby_models: tuple[str, ...] = ()  # models asleep here, fast to wake (model/tiers.py)
    fetching_models: tuple[str, ...] = ()  # being read into the standby tier
    standby_capacity: int = 0  # models the standby tier holds at most
    # Requests on the GPU (running or waiting in the engine), not swapped out; and those
    # swapped to CPU. Derived from `requests` once, as every reader walks them.
    active: tuple[EngineRequest, ...] = field(init=False, repr=False, compare=False)
    swapped: tuple[EngineRequest, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        requests = self.requests
        swapped = tuple(r for r in requests if r.kv_on_cpu)
        active = tuple(r for r in requests if not r.kv_on_cpu) if swapped else requests
        object.__setattr__(self, "active", active)
        object.__setattr__(self, "swapped", swapped)

    @property
    def free_slots(self) -> int:
        return max(0, self.max_num_seqs - len(self.active))

    @property
    def free_kv_tokens(self) -> int:
        return max(0, self.kv_capacity_tokens - self.kv_used_tokens)


@dataclass(frozen=True, slots=True)
class FirstToken:
    request_id: str
    at_s: float


@dataclass(frozen=True, slots=True)
class HandedOff:
    """A prefill engine's request after its first token: its KV (`kv_tokens`: the prompt and
    the tokens made so far) leaves for a decode engine, which goes on from there (simulated
    engines only: the prefill/decode split, qlm/sim/handoff.py carries it across)."""

    request_id: str
    at_s: float
    first_token_at_s: float
    kv_tokens: int


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """Streamed output (live engines only; the simulator does not emit text)."""

    request_id: str
    at_s: float
    text: str
    num_tokens: int
    extras: dict[str, Any] | None = None  # tool calls, log probabilities (output_extras.py)


@dataclass(frozen=True, slots=True)
class RequestFinished:
    """The engine generated a request's last token. (Not qlm.api.streaming.Finished, which
    is what the API hands its client.)"""

    request_id: str
    at_s: float
    first_token_at_s: float
    output_tokens: int
    finish_reason: str = "length"  # "length" | "stop"
    text: str = ""  # full output where the engine produces text
    prompt_tokens: int | None = None  # the engine's own count, where it reports one
    extras: dict[str, Any] | None = None  # the whole output's tool calls and log probabilities


@dataclass(frozen=True, slots=True)
class Aborted:
    """The engine dropped the request (after abort(), or on its own with a reason)."""

    request_id: str
    at_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class ModelLoaded:
    model: str
    at_s: float
    load_s: float


@dataclass(frozen=True, slots=True)
class EngineFailed:
    at_s: float
    reason: str


EngineEvent = (
    FirstToken | TokenChunk | RequestFinished | Aborted | ModelLoaded | EngineFailed | HandedOff
)


class EngineError(RuntimeError):
    """An engine refused an operation (unknown model, no KV swap support, not ready)."""
