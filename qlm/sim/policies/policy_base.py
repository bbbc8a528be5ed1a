"""The simulator's policy extension point: who serves which request, when, on which instance?

A policy sees the simulation through a `SimContext` and answers each happening (an arrival, a
batch of engine events, requests returned to the global queue, one of its own timers) with
LSOs (`qlm.agents.actions`: Pull, Evict, SwapKv, LoadModel) that the runner applies to the
engines. Policies are registered by name in `SIM_POLICIES`; see README.md for each one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

import numpy as np

from qlm.agents.actions import Action, LoadModel
from qlm.clock import Clock
from qlm.config import QlmConfig
from qlm.engine.engine_types import (
    Aborted,
    EngineEvent,
    EngineObservation,
    FirstToken,
    ModelLoaded,
    RequestFinished,
    TokenChunk,
)
from qlm.perf.profile import Profile
from qlm.registry import Registry
from qlm.sim.handoff import roomiest_decode
from qlm.sim.result import TtftPrediction
from qlm.types import Fleet, Instance, Request

Actions = Sequence[Action]
NO_ACTIONS: tuple[Action, ...] = ()


class SimContext(Protocol):
    """What a policy may read and ask for. The runner implements it; state changes only
    through the actions a policy returns."""

    @property
    def fleet(self) -> Fleet: ...

    @property
    def config(self) -> QlmConfig: ...

    @property
    def clock(self) -> Clock: ...

    def queued(self) -> Mapping[str, Request]:
        """The global queue: arrived requests in no engine, in the order they (re)joined it."""
        ...

    def observe(self, instance_id: str) -> EngineObservation:
        """The engine's state now (brought up to the current virtual time first)."""
        ...

    def held(self, instance_id: str) -> int:
        """Requests admitted to the instance's engine that have not ended there."""
        ...

    def model_of(self, instance_id: str) -> str | None:
        """The instance's model: the one loaded, or the one it is loading."""
        ...

    def loading(self, instance_id: str) -> bool: ...

    def serving(self, model: str) -> tuple[str, ...]:
        """The instances with `model` loaded and not loading, in fleet order."""
        ...

    def max_num_seqs(self, instance_id: str) -> int:
        """Sequences the instance's engine runs at once with its current model."""
        ...

    def rng(self, component: str) -> np.random.Generator:
        """This run's seeded stream for a named component."""
        ...

    def call_at(self, at_s: float, tag: str) -> None:
        """Call the policy's on_timer(tag) at virtual time at_s."""
        ...


class SimPolicy(Protocol):
    """One scheduling policy. Every hook returns the actions to apply now, in order."""

    name: str
    # Engine scheduler settings the policy brings with it (a system that ships its own engine
    # scheduler, like Preble's): they override the scenario's `engine` section for its runs.
    engine_settings: Mapping[str, object]

    def start(self, ctx: SimContext) -> Actions: ...

    def on_arrival(self, request: Request) -> Actions: ...

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions: ...

    def on_requeued(self, requests: Sequence[Request]) -> Actions:
        """Requests evicted or dropped by an engine are back in the global queue."""
        ...

    def on_timer(self, tag: str) -> Actions: ...

    def decode_target(
        self, request: Request, kv_tokens: int, candidates: Sequence[EngineObservation]
    ) -> str | None:
        """Where a request a prefill instance handed off decodes: one of `candidates` (ready
        instances on its model that decode, qlm/sim/handoff.py), or None to requeue it."""
        ...

    def stats(self) -> Mapping[str, float]:
        """Deterministic counters for SimResult.policy_stats (replans, ...)."""
        ...

    def wall_s(self) -> float:
        """Wall time the policy spent planning (not part of the deterministic result)."""
        ...

    def ttft_predictions(self) -> Mapping[str, TtftPrediction]:
        """Per request, the time to first token the policy predicted when it arrived (None:
        predicted to miss); empty for policies that predict nothing."""
        ...


SIM_POLICIES: Registry[SimPolicy] = Registry("simulator")


def make_policy(name: str, **options: object) -> SimPolicy:
    """The registered policy `name` (options go to its constructor); an unknown name lists
    the known ones."""
    return SIM_POLICIES.create(name, **options)


class BasePolicy:
    """No-op hooks and the context, so a policy overrides only what it decides."""

    name = ""
    engine_settings: Mapping[str, object] = MappingProxyType({})

    def __init__(self) -> None:
        self._ctx: SimContext | None = None

    @property
    def ctx(self) -> SimContext:
        if self._ctx is None:
            raise RuntimeError(f"policy {self.name!r} used before start()")
        return self._ctx

    def start(self, ctx: SimContext) -> Actions:
        self._ctx = ctx
        return NO_ACTIONS

    def on_arrival(self, request: Request) -> Actions:
        return NO_ACTIONS

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions:
        return NO_ACTIONS

    def on_requeued(self, requests: Sequence[Request]) -> Actions:
        return NO_ACTIONS

    def on_timer(self, tag: str) -> Actions:
        return NO_ACTIONS

    def decode_target(
        self, request: Request, kv_tokens: int, candidates: Sequence[EngineObservation]
    ) -> str | None:
        return roomiest_decode(request, kv_tokens, candidates)

    def stats(self) -> Mapping[str, float]:
        return {}

    def wall_s(self) -> float:
        return 0.0

    def ttft_predictions(self) -> Mapping[str, TtftPrediction]:
        return {}

    # Helpers shared by the baselines.

    def now_s(self) -> float:
        return self.ctx.clock.now_s()

    def instances_of(self, model: str) -> tuple[Instance, ...]:
        """Instances whose model (loaded or loading) is `model`, in fleet order."""
        ctx = self.ctx
        return tuple(i for i in ctx.fleet.instances if ctx.model_of(i.id) == model)

    def ready_with_room(self, instance: Instance) -> bool:
        """Loaded, not loading, and fewer requests held than the engine runs at once."""
        ctx = self.ctx
        return (
            ctx.model_of(instance.id) is not None
            and not ctx.loading(instance.id)
            and ctx.held(instance.id) < ctx.max_num_seqs(instance.id)
        )

    def room_for(
        self, model: str, planned: Sequence[Action], held: Callable[[str], int] | None = None
    ) -> int:
        """Free sequence slots of the instances on `model`: all slots of those loading it
        (this round's loads in `planned` included), the rest less what they hold (`held`,
        default the engine's count; a policy may count an instance it keeps from its model
        as full)."""
        ctx = self.ctx
        held = held or ctx.held
        room = 0
        for i in self.instances_of(model):
            used = 0 if ctx.loading(i.id) else held(i.id)
            room += max(0, ctx.max_num_seqs(i.id) - used)
        for action in planned:
            if isinstance(action, LoadModel) and action.model == model:
                room += ctx.max_num_seqs(action.instance_id)
        return room

    def profile_on(self, instance_id: str) -> Profile | None:
        ctx = self.ctx
        model = ctx.model_of(instance_id)
        if model is None:
            return None
        return ctx.fleet.profile(model, ctx.fleet.instance(instance_id))


def frees_capacity(events: Sequence[EngineEvent]) -> bool:
    """True when an event batch may have freed room in the engine (anything but first
    tokens and streamed chunks)."""
    return any(not isinstance(e, FirstToken | TokenChunk) for e in events)


def kv_need_tokens(request: Request) -> int:
    """KV a request reserves at admission: its prompt plus its whole output cap (the budget
    QLM's agents use by default, so no policy with a global queue has an unfair one)."""
    return request.prompt_tokens + request.max_output_tokens


class AdmissionBook:
    """What a policy has admitted to each engine and the KV it reserved there.

    An engine admits a request while it has a free sequence slot and KV room for
    `kv_need_tokens` (an empty engine always takes one). Kept from the policy's own pulls and
    the engines' RequestFinished/Aborted events, so no engine needs observing per decision.
    """

    def __init__(self) -> None:
        self._held: dict[str, dict[str, int]] = {}  # instance -> request id -> KV reserved
        self._reserved: dict[str, int] = {}
        self._capacity: dict[str, tuple[int, int]] = {}  # instance -> (seqs, KV tokens)

    def refresh(self, ctx: SimContext, instance_id: str) -> None:
        """Read the engine's limits (at start and after a model load)."""
        obs = ctx.observe(instance_id)
        self._capacity[instance_id] = (obs.max_num_seqs, obs.kv_capacity_tokens)
        self._held.setdefault(instance_id, {})
        self._reserved.setdefault(instance_id, 0)

    def held(self, instance_id: str) -> int:
        return len(self._held[instance_id])

    def free_kv_tokens(self, instance_id: str) -> int:
        return self._capacity[instance_id][1] - self._reserved[instance_id]

    def fits(self, instance_id: str, request: Request) -> bool:
        held = self._held[instance_id]
        max_seqs, _ = self._capacity[instance_id]
        if len(held) >= max_seqs:
            return False
        return not held or kv_need_tokens(request) <= self.free_kv_tokens(instance_id)

    def admit(self, instance_id: str, request: Request) -> None:
        need = kv_need_tokens(request)
        self._held[instance_id][request.id] = need
        self._reserved[instance_id] += need

    def on_events(self, ctx: SimContext, instance_id: str, events: Sequence[EngineEvent]) -> None:
        held = self._held[instance_id]
        for event in events:
            if isinstance(event, RequestFinished | Aborted):
                self._reserved[instance_id] -= held.pop(event.request_id, 0)
            elif isinstance(event, ModelLoaded):
                self.refresh(ctx, instance_id)
