"""What an engine takes now, as reconcile counts it (`Room`), and when reconcile would do
nothing for a queue on it (`Room.blocks`): the simulator's agents skip observing an engine
whose room has not changed since a reconcile that did nothing, unless the queue's head moved
to a request the room takes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from qlm.agents.reconcile import (
    Budget,
    EngineTiming,
    QueuedGroup,
    QueuedItem,
    ReconcileConfig,
)
from qlm.engine.engine_types import EngineObservation


@dataclass(frozen=True, slots=True)
class Room:
    """What an engine takes now under reconcile's budget. It stays so until the engine next
    changes (an admitted request starts, ends or leaves: engine events or actions), since
    reconcile counts whole prompts and reserved KV, not progress."""

    model: str | None
    slots: int  # free sequence slots (backlog places included)
    kv_tokens: float  # KV free for new requests; inf for an empty engine
    prompt_tokens: float  # the longest prompt its queued prefill leaves room for; inf: any
    reserve_output_tokens: int | None  # KV reserved per request past its prompt; None: all
    floor_rank: int | None  # the least urgent rank admitted (None: nothing admitted)
    # The most urgent class passes the bound on queued prefill when its first token still
    # comes in time behind it: the queue's seconds, the prefill speed, the time, the ranks.
    urgent_prompt_tokens: float = math.inf  # the same over the most urgent class's prompts
    prefill_queued_s: float = 0.0
    prefill_tokens_per_s: float = math.inf
    now_s: float = 0.0
    priority: Mapping[str, int] = field(default_factory=dict)
    top_rank: int = 0  # the most urgent class's rank

    def takes(self, item: QueuedItem) -> bool:
        """Whether reconcile could admit the item were it the head of the queue."""
        return self.holds(item) and self._prefill_room(item)

    def holds(self, item: QueuedItem) -> bool:
        """Whether a sequence slot and KV are free for the item (the queued prefill aside)."""
        reserve = self.reserve_output_tokens
        need = item.prompt_tokens + (item.max_output_tokens if reserve is None else reserve)
        return self.slots > 0 and need <= self.kv_tokens

    def _prefill_room(self, item: QueuedItem) -> bool:
        if item.prompt_tokens <= self.prompt_tokens:
            return True
        rank = self.priority.get(item.slo_class, 0)
        first_token_at_s = (
            self.now_s + self.prefill_queued_s + item.prompt_tokens / self.prefill_tokens_per_s
        )
        fits = item.prompt_tokens <= self.urgent_prompt_tokens
        return rank >= self.top_rank and fits and first_token_at_s <= item.ttft_deadline_at_s

    def blocks(self, queue: tuple[QueuedGroup, ...], priority: Mapping[str, int]) -> bool:
        """Whether reconcile would do nothing for `queue` on an engine with this room (no
        KV swapping): its head keeps the engine's model, reconcile `stops` at the head's
        first request, and nothing admitted ranks below the head (no victim to preempt)."""
        head = next((group for group in queue if group.items), None)
        if head is None or head.model != self.model:
            return False
        rank = head.top_rank(priority)
        no_victim = self.floor_rank is None or rank <= self.floor_rank
        return no_victim and self.stops(head.ranked(priority)[0])

    def stops(self, item: QueuedItem) -> bool:
        """Whether reconcile stops at the item were it first in line: its prompt fits the
        bound on queued prefill (past it, reconcile passes over it to more urgent requests)
        but no sequence slot or KV is free for it. Independent of time, so a Room kept since
        the engine last changed still answers right."""
        return item.prompt_tokens <= self.prompt_tokens and not self.holds(item)


def room(
    obs: EngineObservation,
    timing: EngineTiming | None,
    priority: Mapping[str, int],
    options: ReconcileConfig | None = None,
) -> Room:
    """The engine's `Room` under reconcile's budget (slots, KV, queued prefill)."""
    budget = Budget(obs, options or ReconcileConfig(), priority, timing)
    prompt = urgent = math.inf
    if budget.prefill_rate is not None and budget.prefill_pending:
        prompt = budget.prefill_left_s * budget.prefill_rate
        urgent = budget.urgent_left_s * budget.prefill_rate
    return Room(
        model=obs.model,
        slots=budget.slots + budget.backlog,
        kv_tokens=math.inf if budget.empty else budget.kv_tokens,
        prompt_tokens=prompt,
        reserve_output_tokens=None if budget.full else budget.reserve,
        floor_rank=budget.floor_rank,
        urgent_prompt_tokens=urgent,
        prefill_queued_s=budget.prefill_queued_s,
        prefill_tokens_per_s=budget.lane_rate or math.inf,
        now_s=budget.now_s,
        priority=priority,
        top_rank=budget.top_rank,
    )
