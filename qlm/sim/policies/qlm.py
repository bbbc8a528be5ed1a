"""`qlm` and its ablations: the production control plane on the virtual clock.

Nothing of the control path is re-implemented here. The production control driver
(qlm/control/driver.py: when to insert arrivals, check, re-plan) runs the production
`Controller` (grouping, RWT estimator, MILP planner); for each instance the production
reconcile step (qlm/agents/reconcile.py) turns the virtual queue agents see
(qlm/agents/virtual_queue.py) and the engine's observation into LSOs, which the runner applies
by the same rules as the live agents (qlm.agents.actions.lso_steps). This file is the
simulator's adapter: it turns driver decisions into timers and agent steps.

* a round timer fires when the driver has something due (its violation check every
  `qlm.control.tick_s` while anything is queued, a re-plan at the time it allows) and runs
  the live loop's round: check, then re-plan;
* a re-plan is published `planning_latency_s` later (by default the solver's budget for that
  plan with `milp`, 0 when it ran none or for heuristic planners); meanwhile agents keep
  reconciling against the previous plan and arrivals wait for the new one. The solver's real
  wall time is measured (`wall_s`) but not charged, so runs stay reproducible;
* an instance is reconciled when an arrival joins one of its groups, when its engine frees
  capacity (a request ends, a model finishes loading), and when a plan is published.

Evicted requests go back to the global queue and stay in their planned group, so the next
reconcile of that group's instance pulls them again; one the plan forgot meanwhile is offered
again like an arrival (as the live loop does).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from qlm.agents.actions import Action, LoadModel, Pull
from qlm.agents.drain import drain_estimate_s, engine_timing
from qlm.agents.reconcile import (
    EngineTiming,
    QueuedGroup,
    ReconcileInput,
    reconcile,
)
from qlm.agents.room import room
from qlm.clock import WallClock
from qlm.control.controller import Controller, InstanceView
from qlm.control.driver import ControlDriver, Decision
from qlm.engine.engine_types import EngineEvent, EngineObservation, FirstToken, RequestFinished
from qlm.estimator.forecast_band import ForecastBand
from qlm.sim.policies.policy_base import (
    NO_ACTIONS,
    SIM_POLICIES,
    Actions,
    BasePolicy,
    SimContext,
    frees_capacity,
)
from qlm.sim.policies.qlm_dispatch import SimDispatch
from qlm.sim.policies.qlm_variants import QlmVariant, pinned_fleet, reproducible
from qlm.sim.result import TtftPrediction
from qlm.types import Request

_ROUND = "round"
_PUBLISH = "publish"
_WAKE = "wake:"  # + instance id: a request held back there (prefix hold, pacing) may start


class QlmPolicy(BasePolicy):
    name = "qlm"

    def __init__(self, variant: QlmVariant | None = None, name: str = "qlm") -> None:
        super().__init__()
        self.variant = variant or QlmVariant()
        self.name = name
        self._driver: ControlDriver | None = None
        self._priority: dict[str, int] = {}
        self._instance_of_group: dict[str, str] = {}
        self._latency_s: float | None = 0.0  # None: each plan's solver budget
        self._members = 0
        self._round_at_s: float | None = None  # the earliest round timer set
        self._counts: Counter[str] = Counter()
        self._wall_s = 0.0
        self._wall = WallClock()
        self._kv_swap: dict[str, bool] = {}  # instance -> its engine swaps KV to CPU
        self._dispatch_view: SimDispatch | None = None
        self._predicted: dict[str, TtftPrediction] = {}
        # The forecasts' bound, learnt as requests finish (as the API learns it live).
        self._band = ForecastBand()
        self._wake_at: dict[str, float] = {}  # instance -> its held-back wake timer

    # Hooks

    def start(self, ctx: SimContext) -> Actions:
        super().start(ctx)
        variant = self.variant
        fleet = pinned_fleet(ctx.fleet) if variant.pin_models else ctx.fleet
        planner = variant.planner or ctx.config.planner.policy
        config = reproducible(ctx.config)
        controller = Controller(config, fleet, self._wall, planner_policy=planner)
        self._driver = ControlDriver(controller, config.control)
        members = self._members = config.control.published_members_per_instance
        priority = self._priority = {c.name: c.priority for c in ctx.config.slo_classes}
        self._dispatch_view = SimDispatch(ctx, priority, members, variant.wake_for_backlog)
        latency = variant.planning_latency_s
        if latency is None and planner != "milp":
            latency = 0.0
        self._latency_s = latency
        # The variant's reconcile settings with the bound on queued prefill the live agents
        # read from the same section (`qlm.control.prefill_backlog_s`).
        bound_s = ctx.config.control.prefill_backlog_s
        self._options = replace(variant.reconcile, prefill_backlog_s=bound_s)
        return NO_ACTIONS

    def on_arrival(self, request: Request) -> Actions:
        self.dispatch.arrived(request)
        self.dispatch.queue(request)
        # Predicted on admission, before anything pulls it, as the API predicts live.
        prediction = self.dispatch.predict(request)
        if prediction is not None:
            self._predicted[request.id] = self._bounded(request, prediction)
        actions = self._follow(self.driver.arrive((request,), self.now_s()))
        if request.id in self.dispatch:  # not pulled where the plan put it
            actions = (*actions, *self._dispatch(request.model, request))
        return actions

    def _bounded(self, request: Request, prediction: TtftPrediction) -> TtftPrediction:
        """The prediction with its bound; the forecast is kept to learn from its outcome."""
        if prediction.predicted_s is None:
            return prediction
        band = self._band
        band.expire(self.now_s())
        upper_s = band.bound(
            request.id, request.slo_class, request.arrival_at_s, prediction.predicted_s
        )
        return replace(prediction, upper_s=upper_s)

    def _learn(self, events: Sequence[EngineEvent]) -> None:
        """Each finished request's forecast against its first token, for the bound."""
        self._band.expire(self.now_s())
        for event in events:
            if isinstance(event, RequestFinished):
                self._band.first_token(event.request_id, event.first_token_at_s)

    def on_requeued(self, requests: Sequence[Request]) -> Actions:
        driver = self.driver
        driver.note_queued(self.now_s())
        for request in requests:
            self.dispatch.queue(request)
        offered = driver.unplanned(requests)  # those the plan forgot while they ran
        self._counts["requeued_offered"] += len(offered)
        return self._follow(driver.arrive(offered, self.now_s()))

    def _dispatch(self, model: str, arrival: Request | None = None) -> Actions:
        """Work conservation: when a request of `model` arrives, the first instance on the
        model with room (`SimDispatch.with_room`, fewest held first) that pulls, pulls."""
        for instance_id in self.dispatch.with_room(model, arrival):
            actions = self._reconcile(instance_id)
            if actions:
                return actions
        return NO_ACTIONS

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions:
        """Reconcile when room may have freed: a request ended, a model loaded, or a prompt's
        prefill finished (its first token: the engine's prefill backlog shrank)."""
        self.dispatch.touched(instance_id)
        self._learn(events)
        if not (frees_capacity(events) or any(isinstance(e, FirstToken) for e in events)):
            return NO_ACTIONS
        return self._reconcile(instance_id)

    def on_timer(self, tag: str) -> Actions:
        if tag.startswith(_WAKE):
            instance_id = tag.removeprefix(_WAKE)
            if self._wake_at.get(instance_id) == self.now_s():
                del self._wake_at[instance_id]
                return self._reconcile(instance_id)
            return NO_ACTIONS
        timers = {_ROUND: self._round, _PUBLISH: self._publish}
        return timers[tag]()

    def stats(self) -> Mapping[str, float]:
        return dict(sorted((self._counts + Counter(self.driver.counts)).items()))

    def wall_s(self) -> float:
        return self._wall_s

    def ttft_predictions(self) -> Mapping[str, TtftPrediction]:
        return self._predicted

    # Driver decisions as timers and agent steps

    def _follow(self, decision: Decision) -> Actions:
        """Wake for what the driver has due next; reconcile the instances whose groups
        arrivals joined."""
        self._schedule_round()
        actions: list[Action] = []
        for _, group_id in decision.joined:
            instance_id = self._instance_of_group.get(group_id)
            if instance_id is not None:
                actions.extend(self._reconcile(instance_id))
        return tuple(actions)

    def _schedule_round(self) -> None:
        """A round timer at the driver's next due time, unless one is set for then or sooner."""
        at_s = self.driver.wake_at_s()
        if at_s is not None and (self._round_at_s is None or at_s < self._round_at_s):
            self._round_at_s = at_s
            self.ctx.call_at(at_s, _ROUND)

    def _round(self) -> Actions:
        """What the live loop does in a round, past offering arrivals (the simulator offers
        them as they come): the violation check when due, then the re-plan when due."""
        now_s = self.now_s()
        if self._round_at_s is not None and self._round_at_s <= now_s:
            self._round_at_s = None
        driver = self.driver
        actions: Actions = NO_ACTIONS
        if driver.check_due(now_s):
            started = self._wall.monotonic_s()
            queued = self._snapshot()
            views = self._views() if driver.check_useful and queued else ()
            driver.check(queued, views, now_s)
            self._wall_s += self._wall.monotonic_s() - started
        if driver.replan_due(now_s):
            actions = self._start_replan(now_s)
        self._schedule_round()
        fetches = self.dispatch.standby_fetches() if self.variant.fetch_standby else ()
        return (*actions, *self._idle_steps(), *fetches)

    def _idle_steps(self) -> Actions:
        """Agent steps for idle instances (no engine events wake them): a swap they
        declined may pay now that the queue moved (a live agent polls the same way)."""
        ctx = self.ctx
        actions: list[Action] = []
        for instance in ctx.fleet.instances:
            if ctx.held(instance.id) == 0 and not ctx.loading(instance.id):
                actions.extend(self._reconcile(instance.id))
        return tuple(actions)

    def _start_replan(self, now_s: float) -> Actions:
        started = self._wall.monotonic_s()
        plan = self.driver.solve(self._snapshot(), self._views(), now_s)
        self._wall_s += self._wall.monotonic_s() - started
        if plan is None:
            return NO_ACTIONS
        latency_s = self._latency_s
        if latency_s is None:  # the solver's budget: what it may take live (0 when none ran)
            latency_s = plan_search_s(self.driver)
        if latency_s <= 0:
            return self._publish()
        self.ctx.call_at(now_s + latency_s, _PUBLISH)
        return NO_ACTIONS

    def _publish(self) -> Actions:
        queued = self.ctx.queued()
        decision = self.driver.adopt(queued.__contains__, self.now_s())
        plan = self.driver.plan
        assert plan is not None
        self._instance_of_group = {
            group_id: instance_id
            for instance_id, group_ids in plan.queues.items()
            for group_id in group_ids
        }
        actions = list(self._follow(replace(decision, joined=())))  # instances: all, below
        for instance in self.ctx.fleet.instances:
            actions.extend(self._reconcile(instance.id))
        return tuple(actions)

    # The agents' step

    def _reconcile(self, instance_id: str) -> tuple[Action, ...]:
        """The agent's step for one instance, and a timer for when a request its dispatch
        held back may start: one left to the instance holding its prefix
        (qlm/prefixes/affinity.py), or a paced one (qlm/agents/pacing.py)."""
        actions = self._step(instance_id)
        at_s = self.dispatch.hold_ends.pop(instance_id, None)
        if at_s is not None and self._wake_at.get(instance_id, math.inf) > at_s:
            self._wake_at[instance_id] = at_s
            self.ctx.call_at(at_s, _WAKE + instance_id)
        return actions

    def _step(self, instance_id: str) -> tuple[Action, ...]:
        """The agent's step for one instance. Shortcuts (`shortcuts`) that cannot change the
        answer skip observing the engine: a loading engine gets nothing, and without KV
        swapping an instance with nothing queued for it gets nothing."""
        ctx = self.ctx
        if not self.variant.shortcuts:
            return self._decide(ctx.observe(instance_id), self._heads(instance_id, True))
        if ctx.loading(instance_id):
            return ()
        obs: EngineObservation | None = None
        kv_swap = self._kv_swap.get(instance_id)
        if kv_swap is None:
            obs = ctx.observe(instance_id)
            kv_swap = self._kv_swap[instance_id] = obs.supports_kv_swap
        if kv_swap:
            obs = obs or ctx.observe(instance_id)
            heads = self._heads(instance_id, bool(obs.swapped))
        else:
            heads = self._heads(instance_id, False)
            if not heads or self._blocked(instance_id, heads):
                return ()
            obs = obs or ctx.observe(instance_id)
        return self._decide(obs, heads)

    def _blocked(self, instance_id: str, heads: tuple[QueuedGroup, ...]) -> bool:
        """Reconcile would do nothing: the engine is as it was when the last one did nothing,
        and its room still does not take the head (`Room.blocks`)."""
        last = self.dispatch.room_of(instance_id)
        return last is not None and last.blocks(heads, self._priority)

    def _decide(self, obs: EngineObservation, heads: tuple[QueuedGroup, ...]) -> tuple[Action, ...]:
        timing = self._timing(obs)
        options = self._options
        actions = reconcile(ReconcileInput(obs, heads, self._priority, timing), options)
        # A KV-swapping engine may swap requests back in, whatever room it has.
        idle_room = not actions and not obs.supports_kv_swap
        room_now = room(obs, timing, self._priority, options) if idle_room else None
        self.dispatch.saw(obs.instance_id, room_now)
        if actions:
            self.dispatch.touched(obs.instance_id)
        for action in actions:
            self._counts[f"lso_{type(action).__name__.lower()}"] += 1
            if isinstance(action, Pull):
                self.dispatch.pulled(action.request_ids, action.instance_id)
            elif isinstance(action, LoadModel):
                self.dispatch.forget(action.instance_id)
                self.dispatch.load_decided(action.instance_id, action.model)
        return actions

    def _timing(self, obs: EngineObservation) -> EngineTiming | None:
        fleet = self.ctx.fleet
        model = obs.model
        profile = None if model is None else fleet.profile(model, fleet.instance(obs.instance_id))
        return engine_timing(obs, profile, self.now_s())

    def _heads(self, instance_id: str, whole: bool) -> tuple[QueuedGroup, ...]:
        return self.dispatch.heads(self.driver.plan, instance_id, whole)

    @property
    def dispatch(self) -> SimDispatch:
        if self._dispatch_view is None:
            raise RuntimeError("qlm policy used before start()")
        return self._dispatch_view

    def _snapshot(self) -> tuple[Request, ...]:
        """The global queue as GlobalQueue.queued() gives it: in arrival order."""
        return tuple(sorted(self.ctx.queued().values(), key=lambda r: (r.arrival_at_s, r.id)))

    def _views(self) -> tuple[InstanceView, ...]:
        ctx = self.ctx
        views = []
        for instance in ctx.fleet.instances:
            obs = ctx.observe(instance.id)
            model = ctx.model_of(instance.id)
            profile = None if model is None else ctx.fleet.profile(model, instance)
            tier = (obs.standby_models, obs.standby_capacity)
            views.append(InstanceView(instance.id, model, drain_estimate_s(obs, profile), *tier))
        return tuple(views)

    @property
    def driver(self) -> ControlDriver:
        if self._driver is None:
            raise RuntimeError("qlm policy used before start()")
        return self._driver


def plan_search_s(driver: ControlDriver) -> float:
    """The solver budget of the driver's latest full re-plan (0: none ran)."""
    solved = driver.controller.last_solve
    return 0.0 if solved is None else solved.search_s


def _qlm(**options: object) -> QlmPolicy:
    return QlmPolicy(QlmVariant(**options))  # type: ignore[arg-type]


def _qlm_no_evict(**options: object) -> QlmPolicy:
    variant = QlmVariant(**options)  # type: ignore[arg-type]
    no_evict = replace(variant.reconcile, allow_evict=False)
    return QlmPolicy(replace(variant, reconcile=no_evict), "qlm-no-evict")


def _qlm_no_swap(**options: object) -> QlmPolicy:
    variant = QlmVariant(**options)  # type: ignore[arg-type]
    no_swap = replace(variant.reconcile, allow_model_swap=False)
    return QlmPolicy(replace(variant, reconcile=no_swap, pin_models=True), "qlm-no-swap")


def _qlm_edf(**options: object) -> QlmPolicy:
    return QlmPolicy(replace(QlmVariant(**options), planner="edf"), "qlm-edf")  # type: ignore[arg-type]


SIM_POLICIES.register("qlm")(_qlm)
SIM_POLICIES.register("qlm-no-evict")(_qlm_no_evict)
SIM_POLICIES.register("qlm-no-swap")(_qlm_no_swap)
SIM_POLICIES.register("qlm-edf")(_qlm_edf)
