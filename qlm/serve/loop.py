"""The live control loop: on arrivals and on a tick, snapshot the queue, let the Controller
(qlm/control/controller.py, the same step the simulator runs) decide whether to re-plan, and
publish. Only the leader plans (a lease in the queue); a failed solve keeps the last good plan."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace

from qlm.clock import Clock
from qlm.config import QlmConfig
from qlm.control.controller import Controller, InstanceView
from qlm.control.liveness import InstanceLiveness
from qlm.control.plan import PlannedGroup, PublishedPlan
from qlm.metrics import NO_METRICS, MetricsHooks
from qlm.queue.base import GlobalQueue
from qlm.queue.records import InstanceStatus
from qlm.serve.config import ControllerSettings
from qlm.types import Fleet, Request

log = logging.getLogger("qlm.controller")


@dataclass
class LoopCounters:
    rounds: int = 0
    replans: int = 0
    inserts: int = 0
    failures: int = 0
    expired: int = 0
    leading: bool = False
    last_solve_s: float = 0.0
    last_status: str = ""


class ControlLoop:
    def __init__(
        self,
        config: QlmConfig,
        fleet: Fleet,
        queue: GlobalQueue,
        clock: Clock,
        settings: ControllerSettings,
        metrics: MetricsHooks | None = None,
    ) -> None:
        self.controller = Controller(config, fleet, clock)
        self.metrics = metrics or NO_METRICS
        self.fleet = fleet
        self.queue = queue
        self.clock = clock
        self.settings = settings
        self.node_id = settings.node_id or f"controller-{uuid.uuid4().hex[:8]}"
        self.counters = LoopCounters()
        self._planned_ids: set[str] = set()
        self._annotated: dict[str, tuple[str, float | None]] = {}  # what records say now
        self._last_replan_s = float("-inf")
        self._replan_due = False  # a re-plan is needed but min_replan_interval_s holds it
        self._shown: tuple[tuple[str, tuple[str, ...]], ...] = ()  # what agents were shown
        self._published_epoch = -1  # the controller epoch of the last publish
        self._liveness = InstanceLiveness(
            (i.id for i in fleet.instances), settings.instance_timeout_s, clock.monotonic_s()
        )

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started_s = self.clock.monotonic_s()
            try:
                await self.step()
            except Exception:
                self.counters.failures += 1
                log.exception("control loop round failed; the last plan stays")
            try:
                await self.queue.wait_for_change(self._wait_s())
            except Exception as exc:  # the queue is unreachable: the loop must outlive that
                log.warning("waiting for queue changes failed (%r); next round in a tick", exc)
                await asyncio.sleep(self.settings.tick_s)
            # Under a flood of arrivals, one round takes many of them (a round's cost grows
            # with the queue, not with the arrivals it takes).
            rest_s = self.settings.min_round_interval_s - (self.clock.monotonic_s() - started_s)
            if rest_s > 0:
                await asyncio.sleep(rest_s)

    def _wait_s(self) -> float:
        """Until the next round at the latest: a tick, or sooner when a re-plan is due but
        was held back by min_replan_interval_s."""
        if not self._replan_due:
            return self.settings.tick_s
        allowed_at_s = self._last_replan_s + self.settings.min_replan_interval_s
        return max(0.0, min(self.settings.tick_s, allowed_at_s - self.clock.now_s()))

    async def step(self) -> PublishedPlan | None:
        self.counters.rounds += 1
        leading = await self.queue.try_lead(self.node_id, self.settings.leader_lease_s)
        self.counters.leading = leading
        self.metrics.leadership(leading)
        if not leading:
            return None
        now_s = self.clock.now_s()
        self.counters.expired += len(await self.queue.expire_leases(now_s))
        queued = await self.queue.queued()
        views = self._views(await self.queue.instances())
        self._planned_ids.intersection_update(r.id for r in queued)  # a requeued one returns
        plan = self._insert_arrivals(queued, now_s)
        reason = self.controller.needs_replan(queued, views, now_s)
        self._replan_due = reason.needed and not self._may_replan(now_s)
        if reason.needed and not self._replan_due:
            plan = await self._replan(queued, views, now_s, reason.why) or plan
        self.metrics.queue_snapshot(queued, self.controller.plan)
        plan = plan or self.controller.plan
        if plan is None:
            return None
        view = _for_agents(plan, queued, self.settings.published_members_per_instance)
        shown = _shown(view)
        if shown == self._shown and plan.epoch == self._published_epoch:
            return None  # agents see this already; a new plan or moved heads republish
        published = await self.queue.publish_plan(view)
        self._shown, self._published_epoch = shown, plan.epoch
        changed, current = self._changed_annotations(plan)
        await self.queue.annotate(changed)
        self._annotated = current  # only once written: a failed write is retried next round
        return published

    def _may_replan(self, now_s: float) -> bool:
        """At most one full re-plan per `min_replan_interval_s` once a plan exists: a solve
        costs up to the planner's time limit, and arrivals between re-plans still join
        their groups through `on_arrival`. Without the bound, a backlog whose groups keep
        turning late would be re-solved on every arrival."""
        if self.controller.plan is None:
            return True
        return now_s - self._last_replan_s >= self.settings.min_replan_interval_s

    def _changed_annotations(
        self, plan: PublishedPlan
    ) -> tuple[PublishedPlan, dict[str, tuple[str, float | None]]]:
        """The part of the plan whose group or predicted wait differs from what the
        records hold (so that a round costs the queue writes of what changed), and the
        annotations the records will hold once it is written."""
        changed: dict[str, list[str]] = {}
        current: dict[str, tuple[str, float | None]] = {}
        for gid, group in plan.groups.items():
            for rid in group.request_ids:
                mark = (gid, plan.predicted_wait_s.get(rid))
                current[rid] = mark
                if self._annotated.get(rid) != mark:
                    changed.setdefault(gid, []).append(rid)
        subsets = {g: _subset(plan.groups[g], ids) for g, ids in changed.items()}
        return replace(plan, groups=subsets), current

    def _insert_arrivals(self, queued: Sequence[Request], now_s: float) -> PublishedPlan | None:
        plan = None
        if self.controller.plan is None:
            return None
        for request in queued:
            if request.id in self._planned_ids:
                continue
            updated = self.controller.on_arrival(request, now_s)
            if updated is None:
                continue  # not insertable: needs_replan will ask for a full re-plan
            self._planned_ids.add(request.id)
            self.counters.inserts += 1
            plan = updated
        return plan

    async def _replan(
        self, queued: Sequence[Request], views: Sequence[InstanceView], now_s: float, why: str
    ) -> PublishedPlan | None:
        """Solve in a worker thread: the solver's native core releases the GIL, so API and
        agents sharing this event loop keep serving meanwhile."""
        self._last_replan_s = now_s
        try:
            plan = await asyncio.to_thread(self.controller.replan, queued, views, now_s)
        except Exception:
            self.counters.failures += 1
            self.metrics.plan_failed()
            log.exception("re-plan failed (%s); keeping the last good plan", why)
            return None
        self.counters.replans += 1
        solve = self.controller.last_solve
        self.metrics.planned(solve, plan, queued, now_s)
        if solve is not None:
            self.counters.last_solve_s = solve.solve_wall_s
            self.counters.last_status = str(solve.status)
        self._planned_ids = {r.id for r in queued}
        log.debug("re-planned (%s): epoch %d", why, plan.epoch)
        return plan

    def _views(self, statuses: Sequence[InstanceStatus]) -> list[InstanceView]:
        """The instances that are up (their agents reported within instance_timeout_s):
        the planner sees only these, so no work waits on a dead agent's instance."""
        by_id = {s.instance_id: s for s in statuses}
        reports = ((s.instance_id, s.at_s) for s in statuses)
        up = self._liveness.update(reports, self.clock.monotonic_s())
        views = []
        for instance in self.fleet.instances:
            if instance.id not in up:
                continue
            status = by_id.get(instance.id)
            if status is None:
                views.append(InstanceView(instance.id, instance.loaded_model, 0.0))
            else:
                views.append(InstanceView(instance.id, status.model, status.busy_s))
        return views


def _for_agents(plan: PublishedPlan, queued: Sequence[Request], members: int) -> PublishedPlan:
    """The plan as agents need it: each instance's virtual queue listing only its first
    `members` requests still queued (agents admit from the head of their queue; the rest
    follows in later epochs as the head leaves). Groups past the head stay, empty, with the
    predicted wait of their last member (`group_wait_s`, for the API's SLO gate). Keeps each
    publish, and each agent's read of it, small however long the queue, and keeps agents from
    walking requests that other instances took."""
    queued_ids = {r.id for r in queued}
    groups: dict[str, PlannedGroup] = {}
    group_wait_s: dict[str, float] = {}
    for group_ids in plan.queues.values():
        budget = members
        for gid in group_ids:
            group = plan.groups.get(gid)
            if group is None:
                continue
            keep = [rid for rid in group.request_ids if rid in queued_ids][: max(budget, 0)]
            budget -= len(keep)
            groups[gid] = group if len(keep) == len(group.request_ids) else _subset(group, keep)
            member_waits = [plan.predicted_wait_s.get(rid) for rid in group.request_ids]
            if known := [w for w in member_waits if w is not None]:
                group_wait_s[gid] = max(known)
    waits = {
        rid: plan.predicted_wait_s[rid]
        for group in groups.values()
        for rid in group.request_ids
        if rid in plan.predicted_wait_s
    }
    return replace(plan, groups=groups, predicted_wait_s=waits, group_wait_s=group_wait_s)


def _shown(view: PublishedPlan) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """What agents see of a plan: per instance, the requests in queue order."""
    return tuple(
        (instance_id, tuple(rid for g in view.queue_of(instance_id) for rid in g.request_ids))
        for instance_id in sorted(view.queues)
    )


def _subset(group: PlannedGroup, request_ids: Sequence[str]) -> PlannedGroup:
    """The group with only `request_ids` (in the group's order), per-member fields kept."""
    wanted = set(request_ids)
    keep = [i for i, rid in enumerate(group.request_ids) if rid in wanted]
    return replace(
        group,
        request_ids=tuple(group.request_ids[i] for i in keep),
        prompt_tokens=tuple(group.prompt_tokens[i] for i in keep if group.prompt_tokens),
        max_output_tokens=tuple(
            group.max_output_tokens[i] for i in keep if group.max_output_tokens
        ),
        slo_classes=tuple(group.slo_classes[i] for i in keep if group.slo_classes),
    )
