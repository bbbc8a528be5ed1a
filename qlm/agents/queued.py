"""What reconcile reads: the queue as an agent sees it (`QueuedItem`, `QueuedGroup`), the
engine's speed (`EngineTiming`), the agent's settings (`ReconcileConfig`) and the whole input
(`ReconcileInput`). Plain frozen values; `reconcile.py` re-exports them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from qlm.config.agent_settings import AgentConfig
from qlm.engine.engine_types import EngineObservation
from qlm.types import Request


@dataclass(frozen=True, slots=True)
class QueuedItem:
    request_id: str
    prompt_tokens: int
    max_output_tokens: int
    slo_class: str = ""  # the request's own class; "" means the group's
    ttft_deadline_at_s: float = math.inf  # when its first token is due (dispatch order)
    arrival_at_s: float = -math.inf  # when it arrived (-inf: unknown; pacing reads it)
    # Its key in a planned batch job's serving order (qlm/prefixes/job_plan.py), else None:
    # such a request is due done by its deadline and served in the job's order.
    job_order: str | None = None
    # The request of its job part that computes the shared prefix (qlm/prefixes/job_plan.py):
    # dispatch holds this one while that one is queued or prefilling on the same engine.
    job_leader: str | None = None

    @classmethod
    def of(cls, request: Request) -> QueuedItem:
        """A queued request as dispatch sees it."""
        return cls(
            request.id,
            request.prompt_tokens,
            request.max_output_tokens,
            request.slo_class,
            request.ttft_deadline_at_s,
            request.arrival_at_s,
            request.job_order,
            request.job_leader,
        )


@dataclass(frozen=True, slots=True)
class QueuedGroup:
    """One planned group as the agent sees it: its members still in the global queue.
    A group may hold members of several classes; each ranks by its own."""

    group_id: str
    model: str
    slo_class: str
    items: tuple[QueuedItem, ...]
    in_order: bool = False  # items are in serving order already (dispatch queues)
    # The distinct classes of the items, found on first use (`classes`).
    _classes: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def classes(self) -> frozenset[str]:
        """The SLO classes among the members."""
        if self._classes is None:
            found = frozenset(it.slo_class or self.slo_class for it in self.items)
            object.__setattr__(self, "_classes", found)
            return found
        return self._classes

    def class_of(self, item: QueuedItem) -> str:
        return item.slo_class or self.slo_class

    def ranked(self, priority: Mapping[str, int]) -> tuple[QueuedItem, ...]:
        """Members, most urgent class first, plan order within a class (as they are, when
        `in_order`)."""
        if self.in_order:
            return self.items
        return tuple(sorted(self.items, key=lambda it: -rank_of(priority, self.class_of(it))))

    def top_rank(self, priority: Mapping[str, int]) -> int:
        return max((rank_of(priority, name) for name in self.classes), default=0)


@dataclass(frozen=True, slots=True)
class ReconcileConfig:
    allow_evict: bool = True
    allow_model_swap: bool = True
    allow_kv_swap: bool = True
    max_pull: int = 256  # requests pulled in one round
    # KV budgeting: True reserves each request's prompt plus its whole output cap, so an
    # admitted request never waits inside the engine or gets preempted there (the global
    # queue, not the engine, holds the waiting); False reserves the prompt plus
    # kv_reserve_output_tokens, admitting more and letting the engine preempt.
    reserve_full_output: bool = True
    kv_reserve_output_tokens: int = 16
    # Requests admitted beyond the engine's sequence slots, to wait inside the engine: the
    # next one starts at the engine's next step instead of a round trip through the agent
    # after each completion. Only requests that outrank nothing in the engine wait there (a
    # more urgent one preempts instead). 0 keeps all waiting in the global queue (the
    # simulator's model).
    engine_backlog: int = 0
    # Prefill the engine may have queued (admitted requests before their first token), in
    # seconds of its prefill speed. The engine prefills in admission order, so an urgent
    # request admitted later waits behind all of it; past this bound work waits in the
    # global queue instead, where urgency orders it and any instance can take it. The
    # engine always gets one prompt to prefill. None: no bound (slots and KV only).
    prefill_backlog_s: float | None = 1.0

    @classmethod
    def of(
        cls, agent: AgentConfig, engine_backlog: int, prefill_backlog_s: float | None = 1.0
    ) -> ReconcileConfig:
        """A live agent's settings (the fleet file's `agent:`), with the backlog the agent uses
        this round (the configured number, or its measured one under auto:
        qlm/agents/engine_loads.py) and the bound on queued prefill
        (`qlm.control.prefill_backlog_s`, the simulator's too)."""
        return cls(
            allow_evict=agent.allow_evict,
            allow_model_swap=agent.allow_model_swap,
            allow_kv_swap=agent.allow_kv_swap,
            engine_backlog=engine_backlog,
            prefill_backlog_s=prefill_backlog_s,
        )


@dataclass(frozen=True, slots=True)
class EngineTiming:
    """How fast the engine works now, from its profile: lets reconcile see that room frees in
    time on its own, so it preempts (wasting the victims' work) only when it does not."""

    now_s: float
    decode_step_s: float  # one decode iteration at the engine's current batch
    prefill_tokens_per_s: float  # the profile's: what the bound on queued prefill counts in
    # How fast queued prompts are prefilled beside the sequences decoding now (drain.py):
    # when the first token of a request admitted behind them comes. None: as above.
    prefill_beside_tokens_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class ReconcileInput:
    observation: EngineObservation
    virtual_queue: tuple[QueuedGroup, ...]  # this instance's groups, in plan order
    priority: Mapping[str, int]  # SLO class -> priority (larger is more urgent)
    timing: EngineTiming | None = None  # None: preempt whenever the head is blocked


def rank_of(priority: Mapping[str, int], slo_class: str) -> int:
    return priority.get(slo_class, 0)
