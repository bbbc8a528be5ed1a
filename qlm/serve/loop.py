"""The live control loop: on queue changes and on a tick, snapshot the queue and the agents'
reports, feed the control driver (qlm/control/driver.py, the same one the simulator's `qlm`
policy runs) and publish the cut of the plan agents see (qlm/agents/virtual_queue.py). Only the
leader plans (a lease in the queue); a failed solve keeps the last good plan."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from qlm.agents.live_warming import LiveWarming
from qlm.agents.virtual_queue import cut_for_agents, shown, subset
from qlm.aio import first_done
from qlm.clock import Clock
from qlm.config import QlmConfig
from qlm.config.serve_config import ControllerConfig
from qlm.control.controller import Controller, InstanceView
from qlm.control.driver import ControlDriver
from qlm.control.liveness import InstanceLiveness
from qlm.control.plan import AgentNotes, PlannedGroup, PublishedPlan, planned_group
from qlm.metrics import NO_METRICS, MetricsHooks
from qlm.prefixes.reports import PrefixHeld
from qlm.queue.queue_protocol import GlobalQueue
from qlm.queue.records import InstanceStatus
from qlm.serve.pool_scaling import PoolScaling
from qlm.types import Fleet, Request

log = logging.getLogger("qlm.controller")
TICK_S = 0.05  # while a solve runs, a round at least this often (and on every queue change)
LEASE_SWEEP_S = 0.5  # expired request leases are looked for at most this often


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
    """The live adapter around the control driver (qlm/control/driver.py): each round reads
    the queue and the agents' reports, feeds the driver, solves in a worker thread when it
    says so, and publishes the cut of the plan agents see."""

    def __init__(
        self,
        config: QlmConfig,
        fleet: Fleet,
        queue: GlobalQueue,
        clock: Clock,
        settings: ControllerConfig,
        metrics: MetricsHooks | None = None,
        scaling: PoolScaling | None = None,
    ) -> None:
        self.driver = ControlDriver(Controller(config, fleet, clock), config.control)
        self.controller = self.driver.controller
        self.metrics = metrics or NO_METRICS
        self.scaling = scaling
        self.fleet = fleet
        self.queue = queue
        self.clock = clock
        self.settings = settings
        self.members = config.control.published_members_per_instance
        self.node_id = settings.node_id or f"controller-{uuid.uuid4().hex[:8]}"
        self.counters = LoopCounters()
        self._annotated: dict[str, tuple[str, float | None]] = {}  # what records say now
        self._shown: tuple[object, ...] = ()  # what agents were shown (queues, prefix_held)
        self._published_epoch = -1  # the controller epoch of the last publish
        self._prefix_held = PrefixHeld()
        self._warming = LiveWarming(fleet)
        self._fetches: Mapping[str, tuple[str, str | None]] = {}  # the last round's
        self._liveness = InstanceLiveness(
            (i.id for i in fleet.instances), settings.instance_timeout_s, clock.monotonic_s()
        )
        self._renew_at_s = float("-inf")  # monotonic: when the leader lease is renewed next
        self._sweep_at_s = float("-inf")  # monotonic: when expired leases are looked for next

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
                await asyncio.sleep(self.driver.config.tick_s)
            # Under a flood of arrivals, one round takes many of them (a round's cost grows
            # with the queue, not with the arrivals it takes).
            rest_s = self.settings.min_round_interval_s - (self.clock.monotonic_s() - started_s)
            if rest_s > 0:
                await asyncio.sleep(rest_s)

    async def _lead(self) -> bool:
        """Whether this node leads: the lease is renewed once a third of it has passed (a
        round every few milliseconds need not write it each time), and asked for every round
        while another node holds it. The lease runs from before the renewal was sent, so
        the renewal is always due before the queue's copy of the lease ends. A lease lost
        while held (a store restarted without it) is noticed at the next renewal: another
        node may plan meanwhile, for a third of a lease at most."""
        sent_s = self.clock.monotonic_s()
        if sent_s < self._renew_at_s:
            return True
        lease_s = self.settings.leader_lease_s
        leading = await self.queue.try_lead(self.node_id, lease_s)
        self._renew_at_s = sent_s + lease_s / 3 if leading else float("-inf")
        return leading

    def _wait_s(self) -> float:
        """Until the next round at the latest: the driver's next check or held-back re-plan,
        and a tick at most (leases expire, agents' reports age)."""
        tick_s = self.driver.config.tick_s
        wake_at_s = self.driver.wake_at_s()
        if wake_at_s is None:
            return tick_s
        return max(0.0, min(tick_s, wake_at_s - self.clock.now_s()))

    async def step(self) -> PublishedPlan | None:
        self.counters.rounds += 1
        leading = await self._lead()
        self.counters.leading = leading
        self.metrics.leadership(leading)
        if not leading:
            return None
        now_s = self.clock.now_s()
        if (at_s := self.clock.monotonic_s()) >= self._sweep_at_s:
            self._sweep_at_s = at_s + LEASE_SWEEP_S
            self.counters.expired += len(await self.queue.expire_leases(now_s))
        queued, statuses = await self._snapshot()
        views = self._views(statuses)
        if self.scaling is not None:  # draining instances get no new work
            up = {v.instance_id for v in views}
            draining = await self.scaling.round(queued, statuses, up, now_s)
            views = [v for v in views if v.instance_id not in draining]
        # Arrivals join the adopted plan, and agents see them, before any re-plan: a solve
        # (regroup + MILP in a worker thread) takes its time limit at best and seconds on a
        # starved CPU, and the arrival that just joined (an interactive request, which the
        # violation check then finds late in its batch group) must not wait for it.
        self._offer(queued, views, now_s)
        up = {v.instance_id for v in views}
        self._fetches = self._warming.round(queued, statuses, up, now_s)
        published = await self._publish(queued, statuses, views)
        if self.driver.replan_due(now_s):
            await self._replan(queued, views, now_s)
            published = await self._publish(queued, statuses, views) or published
        self.metrics.queue_snapshot(queued, self.controller.plan)
        return published

    async def _publish(
        self,
        queued: Sequence[Request],
        statuses: Sequence[InstanceStatus],
        views: Sequence[InstanceView],
    ) -> PublishedPlan | None:
        """Publish the cut of the driver's plan that agents see, and what waits for the next
        plan (before the first, that alone), unless they see it already."""
        queued_ids = {r.id for r in queued}
        waiting = [r for r in self.driver.waiting if r.id in queued_ids]
        plan = self.driver.plan
        if plan is None and not waiting:
            return None
        if plan is None:
            plan = PublishedPlan(0, self.clock.now_s(), {}, {})
        view = cut_for_agents(plan, queued_ids, self.members)
        view = replace(view, groups={**view.groups, **waiting_groups(waiting)})
        up = {v.instance_id for v in views}
        members = {rid for group in view.groups.values() for rid in group.request_ids}
        up_statuses = [s for s in statuses if s.instance_id in up]
        held = self._prefix_held.on(members, queued, up_statuses)
        notes = AgentNotes(
            prefix_held=held,
            queued_counts=queued_counts(queued),
            standby_fetches=self._fetches,
        )
        view = replace(view, notes=notes)
        waiting_ids = tuple(r.id for r in waiting)
        seen = (shown(view), dict(notes.prefix_held), waiting_ids, self._fetches)
        if seen == self._shown and plan.epoch == self._published_epoch:
            return None  # agents see this already; a new plan or moved heads republish
        changed, current = self._changed_annotations(plan)
        # together: a Redis queue writes both in one round trip (qlm/queue/redis/batching.py)
        published, _ = await asyncio.gather(
            self.queue.publish_plan(view), self.queue.annotate(changed)
        )
        self._shown, self._published_epoch = seen, plan.epoch
        self._annotated = current  # only once written: a failed write is retried next round
        return published

    def _offer(
        self, queued: Sequence[Request], views: Sequence[InstanceView], now_s: float
    ) -> None:
        """The driver's part of a round that does not solve: offer what the plan does not
        hold, check when a tick is due (either may ask for a re-plan; `step` runs it after
        publishing what joined)."""
        driver = self.driver
        if queued:
            driver.note_queued(now_s)
        self.counters.inserts += len(driver.arrive(driver.unplanned(queued), now_s).joined)
        if driver.check_due(now_s):
            driver.check(queued, views, now_s)

    def _changed_annotations(
        self, plan: PublishedPlan
    ) -> tuple[PublishedPlan, dict[str, tuple[str, float | None]]]:
        """The part of the plan whose group or predicted wait differs from what the
        records hold (so that a round costs the queue writes of what changed), and the
        annotations the records will hold once it is written."""
        changed: dict[str, list[int]] = {}
        current: dict[str, tuple[str, float | None]] = {}
        for gid, group in plan.groups.items():
            for i, rid in enumerate(group.request_ids):
                mark = (gid, plan.forecast.predicted_wait_s.get(rid))
                current[rid] = mark
                if self._annotated.get(rid) != mark:
                    changed.setdefault(gid, []).append(i)
        subsets = {g: subset(plan.groups[g], positions) for g, positions in changed.items()}
        return replace(plan, groups=subsets), current

    async def _replan(
        self, queued: Sequence[Request], views: Sequence[InstanceView], now_s: float
    ) -> None:
        """Solve in a worker thread (the solver's native core releases the GIL, so API and
        agents sharing this event loop keep serving meanwhile), then adopt at once. Rounds
        go on while it solves: arrivals meanwhile wait for the new plan, but agents are
        shown them (`ControlDriver.waiting`), so a request that comes during a long solve is
        served by deadline like any other of its model, not after the solve."""
        self.driver.begin_solve()
        solving = asyncio.ensure_future(asyncio.to_thread(self.driver.solve, queued, views, now_s))
        while not solving.done():
            await first_done([asyncio.shield(solving), self.queue.wait_for_change(TICK_S)], TICK_S)
            if not solving.done():
                await self._round_while_solving()
        try:
            plan = solving.result()
        except Exception:
            self.driver.failed()
            self.counters.failures += 1
            self.metrics.plan_failed()
            log.exception("re-plan failed; keeping the last good plan")
            return
        if plan is None:
            return
        ids = {r.id for r in queued}
        self.driver.adopt(ids.__contains__, now_s)
        self.counters.replans += 1
        solve = self.controller.last_solve
        self.metrics.planned(solve, plan, queued, now_s)
        if solve is not None:
            self.counters.last_solve_s = solve.solve_wall_s
            self.counters.last_status = str(solve.status)
        log.debug("re-planned: epoch %d", plan.epoch)

    async def _round_while_solving(self) -> None:
        """A round during a solve: offer arrivals (they wait for the new plan) and show them."""
        queued, statuses = await self._snapshot()
        views = self._views(statuses)
        self._offer(queued, views, self.clock.now_s())
        await self._publish(queued, statuses, views)

    async def _snapshot(self) -> tuple[tuple[Request, ...], tuple[InstanceStatus, ...]]:
        """The queued requests and the instances' reports, asked together (a Redis queue
        reads both in one round trip: qlm/queue/redis/batching.py)."""
        return await asyncio.gather(self.queue.queued(), self.queue.instances())

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
                tier = (status.standby_models, status.standby_capacity)
                views.append(InstanceView(instance.id, status.model, status.busy_s, *tier))
        return views


def waiting_groups(waiting: Sequence[Request]) -> dict[str, PlannedGroup]:
    """Requests that wait for a plan being solved, one group per model listed in no queue:
    agents' dispatch serves every member of their model's groups (qlm/agents/dispatch.py)."""
    by_model: dict[str, list[Request]] = {}
    for request in waiting:
        by_model.setdefault(request.model, []).append(request)
    return {
        f"waiting:{model}": planned_group(f"waiting:{model}", model, requests)
        for model, requests in by_model.items()
    }


def queued_counts(queued: Sequence[Request]) -> dict[str, dict[str, int]]:
    """Per model and class, how many requests are queued (PublishedPlan.notes.queued_counts)."""
    counts: dict[str, dict[str, int]] = {}
    for request in queued:
        by_class = counts.setdefault(request.model, {})
        by_class[request.slo_class] = by_class.get(request.slo_class, 0) + 1
    return counts
