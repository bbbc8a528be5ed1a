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
   and KV swapping is on, else evicted back to the global queue. With the engine's timing,
   only when room would not free on its own in time for the head's first member, and only
   as many as seat the members whose first token would otherwise come after its deadline.
5. Swapped-out requests come back (SwapKv to GPU) when nothing queued outranks them and there
   is room.
"""

from __future__ import annotations

__all__ = [
    "Budget",
    "EngineTiming",
    "QueuedGroup",
    "QueuedItem",
    "ReconcileConfig",
    "ReconcileInput",
    "reconcile",
]

import copy
from collections.abc import Mapping

from qlm.agents.actions import Action, Evict, KvDirection, LoadModel, Pull, SwapKv
from qlm.agents.budget import Budget
from qlm.agents.queued import (
    EngineTiming,
    QueuedGroup,
    QueuedItem,
    ReconcileConfig,
    ReconcileInput,
    rank_of,
)
from qlm.engine.engine_types import EngineObservation, EngineState


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
    return _serve(obs, queue, inp.priority, opts, inp.timing)


def _pending(
    queue: tuple[QueuedGroup, ...], model: str | None, opts: ReconcileConfig
) -> tuple[QueuedGroup, ...]:
    groups = tuple(g for g in queue if g.items)
    if not opts.allow_model_swap and model is not None:
        groups = tuple(g for g in groups if g.model == model)
    return groups


def _change_model(
    obs: EngineObservation,
    head: QueuedGroup,
    priority: Mapping[str, int],
    opts: ReconcileConfig,
) -> tuple[Action, ...]:
    if not obs.requests:
        return (LoadModel(obs.instance_id, head.model),)
    head_rank = head.top_rank(priority)
    if opts.allow_evict and all(rank_of(priority, r.slo_class) < head_rank for r in obs.requests):
        ids = tuple(r.request_id for r in obs.requests)
        reason = f"model swap to {head.model} for group {head.group_id}"
        return (Evict(obs.instance_id, ids, reason), LoadModel(obs.instance_id, head.model))
    return ()  # let the running requests drain first


def _serve(
    obs: EngineObservation,
    queue: tuple[QueuedGroup, ...],
    priority: Mapping[str, int],
    opts: ReconcileConfig,
    timing: EngineTiming | None,
) -> tuple[Action, ...]:
    budget = Budget(obs, opts, priority, timing)
    head = queue[0]
    preempt = _preempt_for(obs, head, budget, priority, opts, timing)
    victims = {rid for a in preempt if isinstance(a, Evict | SwapKv) for rid in a.request_ids}
    above: int | None = None  # room freed by preempting goes to more urgent work only
    if victims:  # they are leaving: nothing may park behind them
        ranks = [rank_of(priority, r.slo_class) for r in obs.active if r.request_id not in victims]
        budget.floor_rank = min(ranks) if ranks else None
        above = max(rank_of(priority, r.slo_class) for r in obs.active if r.request_id in victims)
    pulled = _admit(queue, obs.model, budget, priority, above)
    actions: list[Action] = list(preempt)
    if pulled:
        actions.append(Pull(obs.instance_id, pulled))
    if not preempt and not pulled and obs.swapped:
        top = max((g.top_rank(priority) for g in queue), default=None)
        actions.extend(_swap_in(obs, priority, top))
    return tuple(actions)


def _admit(
    queue: tuple[QueuedGroup, ...],
    model: str | None,
    budget: Budget,
    priority: Mapping[str, int],
    above: int | None = None,
) -> tuple[str, ...]:
    """Pull in queue order while there is room. A prompt the queued prefill has no room
    for waits, and so does everything of its class or below behind it (in their order);
    more urgent requests behind it may still pass. The engine prefills in the order pulled:
    most urgent class first, queue order within a class. With `above` (the top rank preempted
    now) only requests outranking it are pulled (else it would evict and pull in turn)."""
    pulled: list[tuple[int, int, str]] = []  # (-rank, queue position, id): the pull order
    waits_up_to = above  # ranks that wait (behind a prompt without prefill room)
    for group in queue:
        if group.model != model:
            break  # never pull past the point where the plan swaps models
        for item in group.ranked(priority):
            rank = rank_of(priority, group.class_of(item))
            if waits_up_to is not None and rank <= waits_up_to:
                continue
            if not budget.prefill_room(item, rank):
                if rank < budget.top_rank:  # the most urgent wait only for their own deadline
                    waits_up_to = rank
                continue
            if budget.admits(item):
                budget.spend(item, rank)
            elif budget.parks(item, rank):
                budget.park(item)
            else:
                return _in_pull_order(pulled)
            pulled.append((-rank, len(pulled), item.request_id))
    return _in_pull_order(pulled)


def _in_pull_order(pulled: list[tuple[int, int, str]]) -> tuple[str, ...]:
    return tuple(request_id for _, _, request_id in sorted(pulled))


def _preempt_for(
    obs: EngineObservation,
    head: QueuedGroup,
    budget: Budget,
    priority: Mapping[str, int],
    opts: ReconcileConfig,
    timing: EngineTiming | None,
) -> tuple[Action, ...]:
    """Free room for the head group's most urgent members by preempting lower-priority
    requests, if they are blocked and room would not free on its own before their deadline.
    Victims go lowest priority first, least progress first, until the members that need it
    (`_needy`) fit, and no further than the last victim that seats one more of them."""
    head_rank = head.top_rank(priority)

    def is_urgent(item: QueuedItem) -> bool:
        return rank_of(priority, head.class_of(item)) == head_rank

    first = next(it for it in head.items if is_urgent(it))
    if not opts.allow_evict or budget.admits(first) or not budget.within_bound(first):
        # Room enough; or queued prefill past the bound, which preempting cannot cut: the
        # head would wait behind it anyway (another instance may take it sooner), and the
        # victims' work would be lost for nothing.
        return ()
    urgent = tuple(it for it in head.items if is_urgent(it))
    if timing is not None and _room_in_time(obs, budget, urgent, timing):
        return ()
    needy = urgent if timing is None else _needy(obs, budget, urgent, head_rank, timing)
    victims = sorted(
        (r for r in obs.active if rank_of(priority, r.slo_class) < head_rank),
        key=lambda r: (rank_of(priority, r.slo_class), r.output_tokens, r.request_id),
    )
    probe = copy.copy(budget)
    taken, seated = 0, _seated(probe, needy)
    for k, victim in enumerate(victims, 1):
        if seated == len(needy):
            break
        probe.release(victim)
        if (now_seated := _seated(probe, needy)) > seated:
            taken, seated = k, now_seated  # a victim past the last that seats one is spared
    # `needy` starts with `first`, which the budget does not seat: a victim that seats one
    # more of them seats `first`, so none taken means evicting all it may would not.
    if taken == 0:
        return ()  # evict nothing
    chosen = victims[:taken]
    for victim in chosen:
        budget.release(victim)
    ids = tuple(v.request_id for v in chosen)
    for_ids = tuple(it.request_id for it in urgent)
    if opts.allow_kv_swap and obs.supports_kv_swap:
        return (SwapKv(obs.instance_id, ids, KvDirection.TO_CPU, for_ids),)
    reason = f"group {head.group_id} ({_class_named(priority, head_rank)}) blocked"
    return (Evict(obs.instance_id, ids, reason, for_ids),)


def _room_in_time(
    obs: EngineObservation, budget: Budget, urgent: tuple[QueuedItem, ...], timing: EngineTiming
) -> bool:
    """Whether the running requests that finish first free room for `urgent` early enough
    for the first of them to get its first token by its deadline (each running request
    needs its remaining output tokens, one per decode iteration)."""
    first = urgent[0]
    prefill_s = first.prompt_tokens / timing.prefill_tokens_per_s
    due_s = min(it.ttft_deadline_at_s for it in urgent) - prefill_s
    if due_s <= timing.now_s:
        return False  # nothing but preemption (if anything) can save it
    probe = copy.copy(budget)
    running = sorted(obs.active, key=lambda r: r.max_output_tokens - r.output_tokens)
    for request in running:
        left_tokens = max(0, request.max_output_tokens - request.output_tokens)
        if timing.now_s + left_tokens * timing.decode_step_s > due_s:
            return False
        probe.release(request)
        if probe.admits(first):
            return True
    return False


def _needy(
    obs: EngineObservation,
    budget: Budget,
    urgent: tuple[QueuedItem, ...],
    rank: int,
    timing: EngineTiming,
) -> tuple[QueuedItem, ...]:
    """The urgent members a preemption is for: those up to the last one whose first token
    would come after its deadline if it waited for room to free on its own. The running
    requests end in the order of their tokens left (one per decode iteration), each freeing
    its room, which the members take in order as it frees. A member that the end of every
    running request would not seat is left out: evicting the lower-priority ones frees no
    more. (Preempting for the whole group evicted every lower-priority request, however
    near its end, when the group was a model's whole dispatch queue.)"""
    probe = copy.copy(budget)
    running = sorted(obs.active, key=lambda r: r.max_output_tokens - r.output_tokens)
    seated = late = 0
    for request in running:
        probe.release(request)
        left_tokens = max(0, request.max_output_tokens - request.output_tokens)
        free_at_s = timing.now_s + left_tokens * timing.decode_step_s
        while seated < len(urgent) and probe.admits(urgent[seated]):
            item = urgent[seated]
            probe.spend(item, rank)
            seated += 1
            if (
                free_at_s + item.prompt_tokens / timing.prefill_tokens_per_s
                > item.ttft_deadline_at_s
            ):
                late = seated
    return urgent[:late]


def _seated(budget: Budget, items: tuple[QueuedItem, ...]) -> int:
    """How many of `items`, in order, the budget's room seats."""
    slots, kv_tokens, empty = budget.slots, budget.kv_tokens, budget.empty
    for n, item in enumerate(items):
        slots -= 1
        kv_tokens -= budget.need(item)
        if slots < 0 or (kv_tokens < 0 and not empty):
            return n
        empty = False
    return len(items)


def _swap_in(
    obs: EngineObservation, priority: Mapping[str, int], queued_top: int | None
) -> tuple[Action, ...]:
    budget_slots = obs.free_slots
    budget_kv = obs.free_kv_tokens
    back: list[str] = []
    for r in sorted(obs.swapped, key=lambda r: (-rank_of(priority, r.slo_class), r.request_id)):
        if queued_top is not None and rank_of(priority, r.slo_class) < queued_top:
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
