"""What an engine has room for in one reconcile step (`Budget`): free sequence slots, KV tokens,
places to wait inside the engine, and the bound on queued prefill, spent as reconcile admits
requests (qlm/agents/reconcile.py, rules 3 and 4) and given back as it preempts.

KV is counted as the engine holds it now, or at each request's output cap with
`reserve_full_output` (no request is then evicted for KV it grows into). The prefill bound
(`prefill_backlog_s`) keeps the prompts queued in the engine within that many seconds of its
prefill speed, so that an urgent request admitted later does not wait behind all of them; past
it, a request of the most urgent class may still join when its class's own queued prompts fit
and its first token still comes by its deadline (`prefill_room`). Pure: every number comes from
the engine's observation, the agent's settings and the engine's timing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from qlm.agents.queued import EngineTiming, QueuedItem, ReconcileConfig
from qlm.engine.engine_types import EngineObservation, EngineRequest


@dataclass(frozen=True, slots=True)
class _Tally:
    """What Budget reads of the engine's active requests, from one pass over them."""

    floor_rank: int | None  # the least urgent class's rank; None for none
    held_tokens: int  # KV held now, or at the output cap (`Budget.held`)
    pending_tokens: int  # prompts not prefilled yet
    urgent_tokens: int  # of those, the most urgent class's

    @classmethod
    def of(
        cls,
        active: Iterable[EngineRequest],
        priority: Mapping[str, int],
        full: bool,
        top_rank: int,
    ) -> _Tally:
        floor: int | None = None
        held = pending = urgent = 0
        for r in active:
            rank = priority.get(r.slo_class, 0)
            if floor is None or rank < floor:
                floor = rank
            context = r.prompt_tokens + r.output_tokens
            held += max(context, r.prompt_tokens + r.max_output_tokens) if full else context
            if not r.started:
                pending += r.prompt_tokens
                if rank >= top_rank:
                    urgent += r.prompt_tokens
        return cls(floor, held, pending, urgent)


class Budget:
    """Free sequence slots, KV tokens and prefill backlog, spent as requests are admitted."""

    def __init__(
        self,
        obs: EngineObservation,
        opts: ReconcileConfig,
        priority: Mapping[str, int],
        timing: EngineTiming | None = None,
    ) -> None:
        self.full = opts.reserve_full_output
        self.reserve = opts.kv_reserve_output_tokens
        # Negative while requests wait inside the engine: preempting for an urgent request
        # must then free those places too before one of its sequences runs.
        self.slots = min(obs.max_num_seqs - len(obs.active), opts.max_pull)
        waiting = max(0, -self.slots)
        self.backlog = max(0, min(opts.engine_backlog - waiting, opts.max_pull - self.slots))
        self.top_rank = max(priority.values(), default=0)
        tally = _Tally.of(obs.active, priority, self.full, self.top_rank)
        self.floor_rank = tally.floor_rank  # least urgent in the engine
        self.kv_tokens = obs.kv_capacity_tokens - max(obs.kv_used_tokens, tally.held_tokens)
        self.empty = not obs.active
        limit = opts.prefill_backlog_s
        rate = None if timing is None or limit is None else timing.prefill_tokens_per_s
        self.prefill_rate = rate  # None: no prefill bound
        pending, urgent = tally.pending_tokens, tally.urgent_tokens
        self.prefill_pending = pending > 0
        self.prefill_left_s = 0.0 if rate is None or limit is None else limit - pending / rate
        # The bound again, over the most urgent class's own queued prompts only.
        self.urgent_left_s = 0.0 if rate is None or limit is None else limit - urgent / rate
        beside = None if timing is None else timing.prefill_beside_tokens_per_s
        self.lane_rate = beside or rate  # None when there is no bound
        self.prefill_queued_s = 0.0 if self.lane_rate is None else pending / self.lane_rate
        self.now_s = 0.0 if timing is None else timing.now_s

    def prefill_room(self, item: QueuedItem, rank: int) -> bool:
        """Whether the item's prompt may join the engine's queued prefill: it always may when
        none is queued; within the bound, it may. Past it, a request of the most urgent
        class still may (nothing that comes later outranks it, so it delays no one who
        matters more) when its class's own queued prompts stay within the bound, so lower
        classes' work queued ahead does not hold it back, and its first token still comes by
        its deadline behind all that is queued."""
        if self.within_bound(item):
            return True
        if rank < self.top_rank or self.prefill_rate is None:
            return False
        fits = self.urgent_left_s >= item.prompt_tokens / self.prefill_rate
        return fits and self.first_token_at_s(item) <= item.ttft_deadline_at_s

    def within_bound(self, item: QueuedItem) -> bool:
        """Whether the item's prompt fits the bound on queued prefill (any prompt does when
        none is queued)."""
        if self.prefill_rate is None or not self.prefill_pending:
            return True
        return self.prefill_left_s >= item.prompt_tokens / self.prefill_rate

    def first_token_at_s(self, item: QueuedItem) -> float:
        """When the item's first token comes if admitted now, behind the queued prefill."""
        rate = self.lane_rate or math.inf
        return self.now_s + self.prefill_queued_s + item.prompt_tokens / rate

    def spend_prefill(self, item: QueuedItem, rank: int) -> None:
        """The item's prompt joins the queued prefill. Requests pulled in one round go to the
        engine most urgent class first (`_admit`), so only a prompt of the most urgent class
        delays the next ones of that class."""
        if self.prefill_rate is None or self.lane_rate is None:
            return
        self.prefill_left_s -= item.prompt_tokens / self.prefill_rate
        if rank >= self.top_rank:
            self.urgent_left_s -= item.prompt_tokens / self.prefill_rate
            self.prefill_queued_s += item.prompt_tokens / self.lane_rate
        self.prefill_pending = True

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
        self.spend_prefill(item, rank)
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
