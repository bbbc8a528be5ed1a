"""The live agent's side of the one dispatch decision (qlm/agents/decision.py): its queue state
kept between rounds (`AgentQueue`), over its view of the fleet (`ReportedFleet`,
qlm/agents/reported_fleet.py).

The decision is the simulator's (`Dispatcher`); what differs is where its inputs come from.
`ReportedFleet` is the live `FleetView`: this instance from its engine's observation (exact,
now), every other instance from its agent's last status report, at most about two
`agent.status_every_s` old. The queue is the published plan's members (the head of each
virtual queue, `control.published_members_per_instance`, and the waiting groups), brought
into the `Dispatcher`'s `ModelQueues` by difference each round: read once per published plan
(a member's fields never change, so those seen before are reused), each member priced once per
pool, the schedule made anew only when its window changes. The recent arrivals that the swap
test reads are the plan's members noted the first time the agent sees them: a request another
instance pulls before this agent reads a plan that holds it is not counted.

With a 2,000-request batch job queued, five agents on one event loop once spent 20 ms a round
making this answer from nothing (65 % of the process): hence the state kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping

from qlm.agents.decision import Dispatcher
from qlm.agents.dispatch import Schedule, dispatch_groups, unseen_paced
from qlm.agents.pacing import Pacing, first_compressed_s, held_back
from qlm.agents.reconcile import QueuedGroup, QueuedItem
from qlm.agents.reported_fleet import ReportedFleet
from qlm.agents.standby_rules import idle_target
from qlm.agents.virtual_queue import head_model, planned_items, virtual_queue
from qlm.control.plan import PublishedPlan
from qlm.types import Fleet

ARRIVALS_KEPT_S = 120.0  # noted member ids are forgotten this long after their arrival


class AgentQueue:
    """One instance's dispatch state across rounds (not thread-safe; one per agent)."""

    def __init__(
        self, fleet: Fleet, instance_id: str, priority: Mapping[str, int], max_jobs: int = 1024
    ) -> None:
        self.fleet = fleet
        self.instance_id = instance_id
        self.decision = Dispatcher(fleet, priority, max_jobs=max_jobs)
        self._held = HeldBackCache()
        self._plan: PublishedPlan | None = None  # the plan `_members` was read from
        self._members: dict[str, dict[str, QueuedItem]] = {}  # model -> request id -> item
        self._noted: dict[str, float] = {}  # member ids whose arrival was noted -> arrival
        self._forget_past = 1024  # prune `_noted` once it holds more ids than this

    def heads(
        self,
        plan: PublishedPlan,
        view: ReportedFleet,
        is_queued: Callable[[str], bool],
        now_s: float,
        limit: int,
        affinity: Callable[[QueuedItem], int] | None = None,
        pacing: Pacing | None = None,
        prefilling: Collection[str] = frozenset(),
    ) -> tuple[QueuedGroup, ...]:
        """What this instance reconciles: its virtual queue when the decision follows the
        plan to another model (`Dispatcher.follows`), else the dispatch queue of the model
        it moves to on its own (`idle_target`, over itself alone: a wake from its standby
        tier or, with none, a cold load of a model no instance holds) or its model's over
        the plan's members of that model (ordered by prefix locality with `affinity`; paced
        requests not due to start yet left out, qlm/agents/pacing.py)."""
        model = view.model_of(self.instance_id)
        head = head_model(plan, self.instance_id, is_queued)
        planned = () if head in (None, model) else virtual_queue(plan, self.instance_id, is_queued)
        asleep = view.standby_models(self.instance_id)  # read by the standby rules
        models = [m for m in (model, head if planned else None, *asleep) if m is not None]
        queued = {m: self._queued(plan, m, is_queued, now_s) for m in models}
        if model is not None and not queued[model] and not view.standby_capacity(self.instance_id):
            for other in self._unheld_models(plan, view, model):  # read by rule 1c
                queued[other] = self._queued(plan, other, is_queued, now_s)
        self._sync(queued)
        decision = self.decision
        if decision.follows(view, self.instance_id, planned, now_s):
            return planned
        if model is None:
            return ()
        woken = idle_target(decision, view, self.instance_id, now_s)  # rules 1b, 1c
        pool: tuple[str, ...]
        if woken is not None:  # a pool of one: no prefix locality (as in the simulator)
            model, pool, affinity = woken, (self.instance_id,), None
        else:
            pool = decision.pool(view, model, self.instance_id)
        kept = decision.schedule(view, model, pool, now_s)
        mine = queued[model]
        unseen = unseen_paced(plan, model, mine.values(), pacing)
        due = self._held.unheld(mine.__contains__, kept, pacing, now_s, unseen)
        return dispatch_groups(model, kept, now_s, limit, due, affinity, prefilling)

    def _unheld_models(self, plan: PublishedPlan, view: ReportedFleet, model: str) -> list[str]:
        """The plan's models besides `model` that this instance can hold and no instance
        serves or loads (rule 1c's candidates; `idle_target` also drops those asleep in a
        tier), by name."""
        instance = self.fleet.instance(self.instance_id)
        models = {group.model for group in plan.groups.values()} - {model}
        return sorted(
            m
            for m in models
            if self.fleet.can_serve(instance, m) and not view.serving(m) and not view.loading(m)
        )

    def _queued(
        self, plan: PublishedPlan, model: str, is_queued: Callable[[str], bool], now_s: float
    ) -> dict[str, QueuedItem]:
        members = self._members_of(plan, model, now_s)
        return {rid: item for rid, item in members.items() if is_queued(rid)}

    def _members_of(self, plan: PublishedPlan, model: str, now_s: float) -> dict[str, QueuedItem]:
        """Every planned member of `model` in `plan`, read once per plan and model; members
        seen for the first time are noted as arrivals (`Dispatcher.arrived`)."""
        if plan is not self._plan:
            self._plan, previous, self._members = plan, self._members, {}
        else:
            previous = {}
        members = self._members.get(model)
        if members is None:
            members = self._members[model] = planned_items(plan, model, previous.get(model, {}))
            self._note(model, members, now_s)
        return members

    def _note(self, model: str, members: Mapping[str, QueuedItem], now_s: float) -> None:
        """Note the members not seen before as arrivals, in arrival order (the set
        difference is taken in C: a plan holds hundreds of members, a round's new ones are
        a few)."""
        noted = self._noted
        fresh = [members[rid] for rid in members.keys() - noted.keys()]
        for item in sorted(fresh, key=lambda it: it.arrival_at_s):
            if math.isfinite(item.arrival_at_s):
                noted[item.request_id] = item.arrival_at_s
                self.decision.arrived(model, item)
        if len(noted) > self._forget_past:  # forget ids long past the arrivals' window
            # ... but never a member still planned: it would be noted again as an arrival
            # (a batch request queued past the window was, every round).
            horizon_s = now_s - ARRIVALS_KEPT_S
            self._noted = {
                rid: at_s for rid, at_s in noted.items() if at_s >= horizon_s or rid in members
            }
            # Twice what is left: when the window itself holds more ids than a fixed bound
            # (35 arrivals a second for 120 s), every round rebuilt the dict (5 % of
            # wc-quick's plane CPU).
            self._forget_past = 2 * len(self._noted) + 4 * len(members) + 1024

    def _sync(self, queued: Mapping[str, dict[str, QueuedItem]]) -> None:
        """Bring the decision's queue in line with what is queued now of the models asked
        about (the others are dropped: this agent serves one model at a time)."""
        queues = self.decision.queues
        for model, items in queued.items():
            queues.sync(model, items)
        for other in queues.models():
            if other not in queued:
                queues.remove(list(queues.items(other)))


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
