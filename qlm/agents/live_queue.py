"""The live agent's dispatch queue, kept between rounds (`AgentQueue`), as the simulator keeps
its own (`ModelQueues`, qlm/agents/model_queues.py).

`agent_queue` (qlm/agents/dispatch.py) says what an agent reconciles: its virtual queue when
it follows the plan to another model, else the dispatch queue of its model over every planned
member of that model. Computed from nothing, that costs a pass over the whole published plan,
a price and a sort per member and a Moore-Hodgson pass per round: with a 2,000-request batch
job queued, five agents on one event loop spent 20 ms a round on it, 65 % of the process, and
interactive requests waited seconds for the loop. `AgentQueue.heads` answers the same
question from state it keeps: the plan's members are read once per published plan (a
member's fields never change, so those seen before are reused), the queue of the model is
the simulator's `ModelQueues` (each member priced once per pool, kept sorted, the schedule
made anew only when its window changes) brought in line with what is still queued by
difference, and pool prices are kept per pool. It orders as the simulator's dispatch over the
same queue does, less the admitted work that delays a class's next first token (the live
agent does not count it, as `agent_queue` does not; drain.start_blocks_by_rank): the first
`max_jobs` requests by due time are checked, the rest follow; requests that can no longer
start in time are set aside behind the dropped ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

from qlm.agents.dispatch import (
    PoolRate,
    Schedule,
    dispatch_groups,
    follows_swap,
    pool_others,
    unseen_paced,
)
from qlm.agents.model_queues import ModelQueues
from qlm.agents.pacing import Pacing, first_compressed_s, held_back
from qlm.agents.reconcile import QueuedGroup, QueuedItem
from qlm.agents.virtual_queue import head_model, planned_items, virtual_queue
from qlm.control.plan import PublishedPlan
from qlm.types import Fleet


class AgentQueue:
    """One instance's dispatch state across rounds (not thread-safe; one per agent)."""

    def __init__(self, fleet: Fleet, instance_id: str, max_jobs: int = 1024) -> None:
        self.fleet = fleet
        self.instance_id = instance_id
        self._queues = ModelQueues(max_jobs)
        self._rates: dict[tuple[str, ...], PoolRate] = {}
        self._held = HeldBackCache()
        self._plan: PublishedPlan | None = None  # the plan `_members` was read from
        self._members: dict[str, dict[str, QueuedItem]] = {}  # model -> request id -> item

    def heads(
        self,
        plan: PublishedPlan,
        model: str | None,
        is_queued: Callable[[str], bool],
        now_s: float,
        limit: int,
        affinity: Callable[[QueuedItem], int] | None = None,
        pacing: Pacing | None = None,
        prefilling: Collection[str] = frozenset(),
    ) -> tuple[QueuedGroup, ...]:
        """`agent_queue`'s answer for this instance (same arguments, less the fleet and the
        instance, which it was made with)."""
        head = head_model(plan, self.instance_id, is_queued)
        planned = () if head in (None, model) else virtual_queue(plan, self.instance_id, is_queued)
        queued: dict[str, QueuedItem] = {}
        if model is not None:
            members = self._members_of(plan, model)
            queued = {rid: item for rid, item in members.items() if is_queued(rid)}
        others = pool_others(plan, self.instance_id, model, is_queued)
        if follows_swap(model, planned, len(queued), lambda: bool(others) or not queued):
            return planned
        if model is None:
            return ()
        self._sync(model, queued)
        pool = (self.instance_id, *others)
        kept = self._queues.schedule(model, pool, self._rate(pool, model), now_s)
        unseen = unseen_paced(plan, model, queued.values(), pacing)
        due = self._held.unheld(queued.__contains__, kept, pacing, now_s, unseen)
        return dispatch_groups(model, kept, now_s, limit, due, affinity, prefilling)

    def _members_of(self, plan: PublishedPlan, model: str) -> dict[str, QueuedItem]:
        """Every planned member of `model` in `plan`, read once per plan and model."""
        if plan is not self._plan:
            self._plan, previous, self._members = plan, self._members, {}
        else:
            previous = {}
        members = self._members.get(model)
        if members is None:
            members = self._members[model] = planned_items(plan, model, previous.get(model, {}))
        return members

    def _sync(self, model: str, queued: dict[str, QueuedItem]) -> None:
        """Bring the kept queue of `model` in line with what is queued now."""
        queues = self._queues
        kept = queues.items(model)
        queues.remove(sorted(kept.keys() - queued.keys()))
        for rid in sorted(queued.keys() - kept.keys()):
            queues.add(queued[rid], model)
        for other in queues.models():
            if other != model:  # this agent serves one model at a time
                queues.remove(list(queues.items(other)))

    def _rate(self, pool: tuple[str, ...], model: str) -> PoolRate:
        rate = self._rates.get((model, *pool))
        if rate is None:
            rate = self._rates[(model, *pool)] = PoolRate.of(self.fleet, pool, model)
        return rate


class HeldBackCache:
    """`held_back` over one schedule, kept while the answer cannot change: before the first
    held request is due to start and before any paced request's compressed due time passes
    (until then `now_s` enters no latest start). A live agent asks every round; the
    schedule stands for many of them, and each answer is a pass over the whole queue."""

    def __init__(self) -> None:
        self._schedule: Schedule | None = None  # kept alive: compared by identity
        self._key: tuple[Pacing, int] | None = None
        self._answer: tuple[frozenset[str], float] = (frozenset(), math.inf)
        self._valid_until_s = -math.inf

    def unheld(
        self,
        is_queued: Callable[[str], bool],
        schedule: Schedule,
        pacing: Pacing | None,
        now_s: float,
        unseen: int = 0,
    ) -> Callable[[str], bool]:
        """`unheld(is_queued, schedule.kept, schedule.due_and_cost, ...)`'s filter."""
        if pacing is None:
            return is_queued
        key = (pacing, unseen)
        same = schedule is self._schedule and key == self._key
        if not same or now_s >= self._valid_until_s:
            kept, due_and_cost = schedule.kept, schedule.due_and_cost
            self._answer = held_back(kept, due_and_cost, pacing, now_s, unseen)
            self._schedule, self._key = schedule, key
            first_s = first_compressed_s(kept, due_and_cost, pacing)
            self._valid_until_s = min(self._answer[1], first_s)
        held = self._answer[0]
        if not held:
            return is_queued
        return lambda request_id: request_id not in held and is_queued(request_id)
