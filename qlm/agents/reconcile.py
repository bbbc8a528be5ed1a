"""The pure reconcile step: an instance's virtual queue + its engine's state -> LSOs.

One function answers "what should this agent do now?" for the live agents and the simulator
alike. The rules, in order:

1. A loading or failed engine gets nothing.
2. The head of the virtual queue is its first group with requests still queued. If the head
   needs another model, the instance swaps (LoadModel) once the engine is empty. If the head
   outranks everything running and evictions are allowed, the running requests are evicted
   first, so the swap does not wait for them to drain. Without model swapping, groups of
   other models are skipped.
3. Requests of the loaded model are pulled in virtual-queue order, from the run of groups
   that starts at the head and keeps the loaded model, while the engine has free sequence
   slots and KV room for their prompts.
4. When the head group is blocked for lack of room and outranks running requests, the
   lowest-priority ones (least progress first) are swapped to CPU when the engine supports it
   and KV swapping is on, else evicted back to the global queue.
5. Swapped-out requests come back (SwapKv to GPU) when nothing queued outranks them and there
   is room.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from qlm.agents.actions import Action, Evict, KvDirection, LoadModel, Pull, SwapKv
from qlm.engine.types import EngineObservation, EngineRequest, EngineState


@dataclass(frozen=True, slots=True)
class QueuedItem:
    request_id: str
    prompt_tokens: int
    max_output_tokens: int
    slo_class: str = ""  # the request's own class; "" means the group's


@dataclass(frozen=True, slots=True)
class _Ranked:
    item: QueuedItem
    rank: int


@dataclass(frozen=True, slots=True)
class QueuedGroup:
    """One planned group as the agent sees it: its members still in the global queue.
    A group may hold members of several classes; each ranks by its own."""

    group_id: str
    model: str
    slo_class: str
    items: tuple[QueuedItem, ...]

    def class_of(self, item: QueuedItem) -> str:
        return item.slo_class or self.slo_class

    def ranked(self, priority: Mapping[str, int]) -> tuple[QueuedItem, ...]:
        """Members, most urgent class first, plan order within a class."""
        return tuple(sorted(self.items, key=lambda it: -_rank(priority, self.class_of(it))))

    def top_rank(self, priority: Mapping[str, int]) -> int:
        return max((_rank(priority, self.class_of(it)) for it in self.items), default=0)


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


@dataclass(frozen=True, slots=True)
class ReconcileInput:
    observation: EngineObservation
    virtual_queue: tuple[QueuedGroup, ...]  # this instance's groups, in plan order
    priority: Mapping[str, int]  # SLO class -> priority (larger is more urgent)


def reconcile(inp: ReconcileInput, options: ReconcileConfig | None = None) -> tuple[Action, ...]:
    opts = options or ReconcileConfig()
    obs = inp.observation
    if obs.state in (EngineState.LOADING, EngineState.FAILED):
        return ()
    queue = _pending(inp.virtual_queue, obs.model, opts)
    if not queue:
        return _swap_in(obs, inp.priority, None)
    head = queue[0]
    if head.model != obs.model:
        return _change_model(obs, head, inp.priority, opts)
    return _serve(obs, queue, inp.priority, opts)


def _pending(
    queue: tuple[QueuedGroup, ...], model: str | None, opts: ReconcileConfig
) -> tuple[QueuedGroup, ...]:
    groups = tuple(g for g in queue if g.items)
    if not opts.allow_model_swap and model is not None:
        groups = tuple(g for g in groups if g.model == model)
    return groups


def _rank(priority: Mapping[str, int], slo_class: str) -> int:
    return priority.get(slo_class, 0)


def _change_model(
    obs: EngineObservation,
    head: QueuedGroup,
    priority: Mapping[str, int],
    opts: ReconcileConfig,
) -> tuple[Action, ...]:
    if not obs.requests:
        return (LoadModel(obs.instance_id, head.model),)
    head_rank = head.top_rank(priority)
    if opts.allow_evict and all(_rank(priority, r.slo_class) < head_rank for r in obs.requests):
        ids = tuple(r.request_id for r in obs.requests)
        reason = f"model swap to {head.model} for group {head.group_id}"
        return (Evict(obs.instance_id, ids, reason), LoadModel(obs.instance_id, head.model))
    return ()  # let the running requests drain first


class _Budget:
    """Free sequence slots and KV tokens, spent as requests are admitted."""

    def __init__(
        self, obs: EngineObservation, opts: ReconcileConfig, priority: Mapping[str, int]
    ) -> None:
        self.full = opts.reserve_full_output
        self.reserve = opts.kv_reserve_output_tokens
        # Negative while requests wait inside the engine: preempting for an urgent request
        # must then free those places too before one of its sequences runs.
        self.slots = min(obs.max_num_seqs - len(obs.active), opts.max_pull)
        waiting = max(0, -self.slots)
        self.backlog = max(0, min(opts.engine_backlog - waiting, opts.max_pull - self.slots))
        ranks = [_rank(priority, r.slo_class) for r in obs.active]
        self.floor_rank = min(ranks) if ranks else None  # least urgent in the engine
        held = sum(self.held(r) for r in obs.active)
        self.kv_tokens = obs.kv_capacity_tokens - max(obs.kv_used_tokens, held)
        self.empty = not obs.active

    def held(self, request: EngineRequest) -> int:
        """KV a running request holds now, or will hold at its output cap."""
        if self.full:
            return max(request.context_tokens, request.prompt_tokens + request.max_output_tokens)
        return request.context_tokens

    def need(self, item: QueuedItem) -> int:
        return item.prompt_tokens + (item.max_output_tokens if self.full else self.reserve)

    def admits(self, item: QueuedItem) -> bool:
        # An empty engine always takes one request, however large: the engine decides.
        return self.slots > 0 and (self.need(item) <= self.kv_tokens or self.empty)

    def spend(self, item: QueuedItem, rank: int) -> None:
        self.slots -= 1
        self.kv_tokens -= self.need(item)
        self.empty = False
        self.floor_rank = rank if self.floor_rank is None else min(self.floor_rank, rank)

    def parks(self, item: QueuedItem, rank: int) -> bool:
        """Whether the item may wait inside the engine: a backlog place, KV for it, and
        nothing in the engine that it outranks (it would wait behind that work)."""
        return (
            self.backlog > 0
            and self.need(item) <= self.kv_tokens
            and self.floor_rank is not None
            and rank <= self.floor_rank
        )

    def park(self, item: QueuedItem) -> None:
        self.backlog -= 1
        self.kv_tokens -= self.need(item)

    def release(self, request: EngineRequest) -> None:
        self.slots += 1
        self.kv_tokens += self.held(request)


def _serve(
    obs: EngineObservation,
    queue: tuple[QueuedGroup, ...],
    priority: Mapping[str, int],
    opts: ReconcileConfig,
) -> tuple[Action, ...]:
    budget = _Budget(obs, opts, priority)
    head = queue[0]
    preempt = _preempt_for(obs, head, budget, priority, opts)
    victims = {rid for a in preempt if isinstance(a, Evict | SwapKv) for rid in a.request_ids}
    if victims:  # they are leaving: nothing may park behind them
        ranks = [_rank(priority, r.slo_class) for r in obs.active if r.request_id not in victims]
        budget.floor_rank = min(ranks) if ranks else None
    pulled = _admit(queue, obs.model, budget, priority)
    actions: list[Action] = list(preempt)
    if pulled:
        actions.append(Pull(obs.instance_id, pulled))
    if not preempt and not pulled:
        top = max((g.top_rank(priority) for g in queue), default=None)
        actions.extend(_swap_in(obs, priority, top))
    return tuple(actions)


def _admit(
    queue: tuple[QueuedGroup, ...],
    model: str | None,
    budget: _Budget,
    priority: Mapping[str, int],
) -> tuple[str, ...]:
    pulled: list[str] = []
    for group in queue:
        if group.model != model:
            break  # never pull past the point where the plan swaps models
        for item in group.ranked(priority):
            rank = _rank(priority, group.class_of(item))
            if budget.admits(item):
                budget.spend(item, rank)
            elif budget.parks(item, rank):
                budget.park(item)
            else:
                return tuple(pulled)
            pulled.append(item.request_id)
    return tuple(pulled)


def _preempt_for(
    obs: EngineObservation,
    head: QueuedGroup,
    budget: _Budget,
    priority: Mapping[str, int],
    opts: ReconcileConfig,
) -> tuple[Action, ...]:
    """Free room for the head group's most urgent members by preempting lower-priority
    requests, if they are blocked. Victims go lowest priority first, least progress first,
    until those members fit."""
    head_rank = head.top_rank(priority)
    urgent = tuple(it for it in head.items if _rank(priority, head.class_of(it)) == head_rank)
    if not opts.allow_evict or budget.admits(urgent[0]):
        return ()
    victims = sorted(
        (r for r in obs.active if _rank(priority, r.slo_class) < head_rank),
        key=lambda r: (_rank(priority, r.slo_class), r.output_tokens, r.request_id),
    )
    chosen: list[str] = []
    for victim in victims:
        if _fits_all(budget, urgent):
            break
        budget.release(victim)
        chosen.append(victim.request_id)
    if not chosen:
        return ()
    ids = tuple(chosen)
    if opts.allow_kv_swap and obs.supports_kv_swap:
        return (SwapKv(obs.instance_id, ids, KvDirection.TO_CPU),)
    reason = f"group {head.group_id} ({_class_named(priority, head_rank)}) blocked"
    return (Evict(obs.instance_id, ids, reason),)


def _fits_all(budget: _Budget, items: tuple[QueuedItem, ...]) -> bool:
    slots, kv_tokens, empty = budget.slots, budget.kv_tokens, budget.empty
    for item in items:
        slots -= 1
        kv_tokens -= budget.need(item)
        if slots < 0 or (kv_tokens < 0 and not empty):
            return False
        empty = False
    return True


def _swap_in(
    obs: EngineObservation, priority: Mapping[str, int], queued_top: int | None
) -> tuple[Action, ...]:
    budget_slots = obs.free_slots
    budget_kv = obs.free_kv_tokens
    back: list[str] = []
    for r in sorted(obs.swapped, key=lambda r: (-_rank(priority, r.slo_class), r.request_id)):
        if queued_top is not None and _rank(priority, r.slo_class) < queued_top:
            break
        if budget_slots < 1 or r.context_tokens > budget_kv:
            break
        budget_slots -= 1
        budget_kv -= r.context_tokens
        back.append(r.request_id)
    if not back:
        return ()
    return (SwapKv(obs.instance_id, tuple(back), KvDirection.TO_GPU),)


def _class_named(priority: Mapping[str, int], rank: int) -> str:
    return next((name for name, r in priority.items() if r == rank), str(rank))
