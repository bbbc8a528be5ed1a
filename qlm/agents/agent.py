"""The live agent: one per instance. Each round it turns engine events into queue updates
(agent_events.py), decides what its instance serves next (qlm/agents/live_queue.py: the
dispatch decision the simulator runs, qlm/agents/decision.py, over this engine and the other
agents' reports), reconciles that against the engine (the pure step in
qlm/agents/reconcile.py) and applies the resulting LSOs. Every decision is the pure core's;
this file is I/O."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping, Sequence

from qlm.agents.actions import Action, Evict, KvDirection, LoadModel, Pull, SwapKv, lso_steps
from qlm.agents.agent_events import EventWriter
from qlm.agents.agent_reports import instance_status
from qlm.agents.drain import engine_timing, load_left_s
from qlm.agents.engine_loads import ModelLoads, RefillBacklog
from qlm.agents.job_gate import prefilling_ids
from qlm.agents.leases import LeaseKeeper
from qlm.agents.live_queue import AgentQueue
from qlm.agents.live_warming import start_fetch
from qlm.agents.pacing import Pacing
from qlm.agents.reconcile import (
    EngineTiming,
    QueuedGroup,
    ReconcileConfig,
    ReconcileInput,
    reconcile,
)
from qlm.agents.reported_fleet import PeerReports, ReportedFleet
from qlm.agents.rounds import AgentCounters, Held
from qlm.aio import first_done
from qlm.clock import Clock
from qlm.config import ControlConfig
from qlm.config.agent_settings import AgentConfig
from qlm.control.plan import PublishedPlan
from qlm.engine.client import EngineClient, EventWaiter
from qlm.engine.engine_types import (
    EngineEvent,
    EngineObservation,
    TokenChunk,
)
from qlm.metrics import NO_METRICS, MetricsHooks
from qlm.prefixes.reports import EARLY_REPORT_S, AgentPrefixes
from qlm.queue.queue_protocol import GlobalQueue
from qlm.queue.records import InstanceStatus
from qlm.types import Fleet, Instance, Request

log = logging.getLogger("qlm.agent")


class Agent:
    def __init__(
        self,
        instance: Instance,
        engine: EngineClient,
        queue: GlobalQueue,
        fleet: Fleet,
        clock: Clock,
        settings: AgentConfig,
        priority: Mapping[str, int],
        metrics: MetricsHooks | None = None,
        pacing: Pacing | None = None,
        control: ControlConfig | None = None,
    ) -> None:
        self.instance = instance
        self.metrics = metrics or NO_METRICS
        self.engine = engine
        self.queue = queue
        self.fleet = fleet
        self.clock = clock
        self.settings = settings
        self.priority = dict(priority)
        self.counters = AgentCounters()
        self._held: dict[str, Held] = {}
        self._taken: set[str] = set()  # planned ids that another instance got first
        self._epoch = -1
        self._last_reconcile_s = float("-inf")
        self.leases = LeaseKeeper(instance.id, queue, clock, settings.lease_s)
        self._last_status_s = -1e18
        self._loads = ModelLoads()
        self.events = EventWriter(
            instance.id, queue, clock, self.metrics, self.counters, self._held, self._loads,
            settings.max_dispatches,
        )  # fmt: skip
        self._backlog = RefillBacklog(settings.engine_backlog)
        self.prefixes = AgentPrefixes(instance.id)
        self.dispatch = AgentQueue(fleet, instance.id, self.priority)
        self.peers = PeerReports(instance.id, settings.status_every_s)
        self.pacing = pacing
        # The decision's settings shared with the simulator (`qlm.control`).
        self.control = control or ControlConfig()

    async def run(self, stop: asyncio.Event) -> None:
        keeping = self.leases.keep(self._held, stop)
        keeper = asyncio.create_task(keeping, name=f"leases-{self.instance.id}")
        try:
            while not stop.is_set():
                try:
                    await self.step()
                    self.leases.round_done()
                except Exception:  # a failed round must not kill the agent
                    log.exception("agent %s: round failed", self.instance.id)
                    await self._idle(stop, wake_on_plan=False)
                else:
                    await self._idle(stop, wake_on_plan=True)
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)

    def _forget_lost(self) -> None:
        """Abort the runs whose lease was lost, before this round polls the engine: their
        Aborted events then find nothing held, and a later pull of the same id is a new run."""
        dropped = self.leases.take_lost(self._held)
        if dropped:
            for rid in dropped:
                del self._held[rid]
            what = f"{len(dropped)} requests ({', '.join(dropped[:5])})"
            log.warning("agent %s: lost the lease of %s; aborting them", self.instance.id, what)
            self.events.evicting.difference_update(dropped)
            self.engine.abort(dropped)

    async def _idle(self, stop: asyncio.Event, *, wake_on_plan: bool) -> None:
        """Sleep until engine events, a newer plan (not after a failed round: it would fail the
        same way), the stop signal, or `poll_s` at the latest (leases, status, time decisions)."""
        timeout_s = self.settings.poll_s
        waits: list[Awaitable[bool]] = [stop.wait()]
        if wake_on_plan:
            waits.append(self.queue.wait_for_plan(self._epoch, timeout_s))
        if isinstance(self.engine, EventWaiter):
            waits.append(self.engine.wait_events(timeout_s, self.settings.token_flush_s))
        await first_done(waits, timeout_s)

    async def step(self) -> tuple[Action, ...] | None:
        """One round: events, reconcile, apply, leases, status. None when there is no plan
        to reconcile against."""
        self._forget_lost()
        events = self.engine.poll()
        self._backlog.saw(events, self._held)
        await self.events.handle(events)
        plan = await self.queue.current_plan()
        actions: tuple[Action, ...] | None = None
        if plan is not None:
            new_plan = plan.epoch != self._epoch
            if new_plan:
                self._epoch, self._taken = plan.epoch, set()
            if not (new_plan or self._reconcile_due(events)):
                return ()  # only tokens streamed: nothing to decide, the next round will
            self._last_reconcile_s = self.clock.monotonic_s()
            await self.peers.refresh(self.queue, self.clock.now_s())
            obs = self.engine.observe()
            inp = ReconcileInput(obs, self._heads(plan, obs), self.priority, self._timing(obs))
            options = ReconcileConfig.of(
                self.settings, self._backlog.size, self.control.prefill_backlog_s
            )
            actions = reconcile(inp, options)
            await self._apply(lso_steps(actions, tuple(self._held), obs.model))
            self.counters.fetches += start_fetch(self.engine, self.instance.id, plan)
        await self._housekeeping()
        return actions

    def _reconcile_due(self, events: Sequence[EngineEvent]) -> bool:
        """Whether a round must decide again: anything but streamed tokens happened, or a
        poll period passed (deciding on every token starved the event loop)."""
        if any(not isinstance(e, TokenChunk) for e in events) or not events:
            return True  # room freed, a prefill ended (first token), a model loaded, ...
        return self.clock.monotonic_s() - self._last_reconcile_s >= self.settings.poll_s

    def _heads(self, plan: PublishedPlan, obs: EngineObservation) -> tuple[QueuedGroup, ...]:
        """What this instance serves next (qlm/agents/live_queue.py), less what another
        instance took or the engine holds."""

        def still_queued(request_id: str) -> bool:
            return request_id not in self._taken and request_id not in self._held

        now_s = self.clock.now_s()
        model = obs.model
        profile = None if model is None else self.fleet.profile(model, self.instance)
        view = ReportedFleet(self.fleet, self.instance.id, obs, self.priority, self.peers.reports)
        pool = None if model is None else self.dispatch.decision.pool(view, model, self.instance.id)
        affinity = self.prefixes.affinity(plan.notes.prefix_held, profile, now_s, pool)
        limit = obs.max_num_seqs + self._backlog.size  # what one round may pull
        rest = (now_s, limit, affinity, self.pacing, prefilling_ids(obs))
        heads = self.dispatch.heads(plan, view, still_queued, *rest)
        if affinity is not None:
            affinity.prune()
        return heads

    def _timing(self, obs: EngineObservation) -> EngineTiming | None:
        model = obs.model
        profile = None if model is None else self.fleet.profile(model, self.instance)
        return engine_timing(obs, profile, self.clock.now_s())

    async def _apply(self, actions: Sequence[Action]) -> None:
        claimed = await self._claim(actions)
        if claimed is None:
            return  # another instance got what the preemption was for: nothing to do
        try:
            await self._carry_out(actions, claimed)
        finally:  # claimed for a preemption, not submitted (the round failed): back
            if claimed:
                await self.events.requeue(list(claimed), evicted=False)

    async def _carry_out(self, actions: Sequence[Action], claimed: dict[str, Request]) -> None:
        for action in actions:
            if isinstance(action, Pull):
                await self._pull(action.request_ids, claimed)
            elif isinstance(action, Evict):
                log.debug(
                    "agent %s: evicting %s: %s", self.instance.id, action.request_ids, action.reason
                )
                self._evict(action.request_ids)
            elif isinstance(action, LoadModel):  # lso_steps evicted what the engine held
                before = self.engine.observe()
                self.engine.load_model(action.model)
                self.prefixes.forget()
                warm = action.model in before.standby_models
                self._loads.started(action.model, self.clock.now_s(), warm=warm)
                self.counters.swaps += 1
                self.metrics.model_swap_started(self.instance.id, action.model, before.model)
                # Report the load at the end of this round, not a period later: the others
                # count it in the model's pool (they do not load the same model for the same
                # requests; the simulator's steps at one instant see it: SimDispatch.load_decided)
                self._last_status_s = -1e18
            elif isinstance(action, SwapKv):
                if action.direction is KvDirection.TO_CPU:
                    self.engine.swap_out(action.request_ids)
                    self.counters.evictions += len(action.request_ids)
                    held = [self._held[r].request for r in action.request_ids if r in self._held]
                    self.metrics.evicted(self.instance.id, held, kind="kv_swap")
                else:
                    self.engine.swap_in(action.request_ids)

    async def _claim(self, actions: Sequence[Action]) -> dict[str, Request] | None:
        """Lease first what a preemption frees room for (of what this round pulls): agents
        of one model see the same blocked head, and only the one whose claim wins preempts.
        None when all of it went elsewhere: the round's actions are dropped."""
        preempts = [a for a in actions if isinstance(a, Evict | SwapKv) and a.for_request_ids]
        if not preempts:
            return {}
        pulled = {rid for a in actions if isinstance(a, Pull) for rid in a.request_ids}
        wanted = [rid for a in preempts for rid in a.for_request_ids if rid in pulled]
        got = await self._lease(wanted)
        if wanted and not got:
            log.info("agent %s: %s went elsewhere; no preemption", self.instance.id, wanted)
            return None
        return {r.id: r for r in got}

    async def _pull(self, request_ids: Sequence[str], claimed: dict[str, Request]) -> None:
        """Lease what is not `claimed` yet; submit each id once, in the pull's order, unless
        the engine runs it already. What was leased but not submitted goes back to the queue
        (held unsubmitted, it would only wait for its lease to run out)."""
        ids = list(dict.fromkeys(request_ids))
        got = {r.id: r for r in await self._lease(ids)} | claimed
        running = {r.request_id for r in self.engine.observe().requests}
        unsent = [rid for rid in ids if rid in got and rid not in running]
        try:
            for rid in list(unsent):
                self.engine.submit(got[rid])
                unsent.remove(rid)
                claimed.pop(rid, None)
        finally:  # claimed ones go back in _apply
            if leftover := [rid for rid in unsent if rid not in claimed]:
                await self.events.requeue(leftover, evicted=False)

    async def _lease(self, request_ids: Sequence[str]) -> list[Request]:
        """Take requests from the global queue for this instance (those another instance
        took first are noted, not retried) and hold them; not submitted yet."""
        # An id this agent still runs was requeued when its lease ran out: the engine runs it
        # until a round forgets the lost lease and aborts it; pulled now, it would run twice.
        request_ids = [rid for rid in request_ids if rid not in self._held]
        if not request_ids:
            return []
        now_s = self.clock.now_s()
        lease_s = self.settings.lease_s
        pulled = await self.queue.pull_counted(self.instance.id, request_ids, lease_s, now_s)
        got = [p.request for p in pulled]
        got_ids = {r.id for r in got}
        self._taken.update(rid for rid in request_ids if rid not in got_ids)
        self.prefixes.pulled(got, self.engine.observe().kv_capacity_tokens)
        for p in pulled:
            self._held[p.request.id] = Held(
                p.request, now_s, p.dispatches, first_token_at_s=p.first_token_at_s
            )
        self.counters.pulled += len(got)
        return got

    def _evict(self, request_ids: Sequence[str]) -> None:
        evicting = self.events.evicting
        ids = [rid for rid in request_ids if rid in self._held and rid not in evicting]
        if ids:
            evicting.update(ids)
            self.engine.abort(ids)

    async def _housekeeping(self) -> None:
        await self.leases.renew(self._held)
        now_s = self.clock.now_s()
        period_s = self.settings.status_every_s
        if self.prefixes.changed:  # new prefix blocks: tell the others soon
            period_s = min(period_s, EARLY_REPORT_S)
        if now_s - self._last_status_s >= period_s:
            status = self.status(now_s)
            await self.queue.report_instance(status)
            self.metrics.instance_status(status)
            self._last_status_s = now_s

    def status(self, now_s: float) -> InstanceStatus:
        obs = self.engine.observe()
        profile = self.fleet.profile(obs.model, self.instance) if obs.model else None
        started_s = self._loads.started_at_s(obs.model, now_s)
        left_s = load_left_s(profile, self._loads.warm, now_s - started_s)
        return instance_status(
            self.instance.id,
            obs,
            profile,
            left_s,
            self.priority,
            now_s,
            (self.counters.swaps, self.counters.evictions, self.prefixes.report()),
        )
