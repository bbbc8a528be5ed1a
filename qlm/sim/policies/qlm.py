"""`qlm` and its ablations: the production control plane on the virtual clock.

The production `Controller` (qlm/control: k-means groups, RWT estimator, MILP planner) publishes
virtual queues; for each instance the production reconcile step (qlm/agents/reconcile.py) turns
the published plan and the engine's observation into LSOs, which the runner applies. Nothing of
either is re-implemented here; this file only decides *when* they run:

* a full re-plan when the controller has no plan, when an arrival fits no planned group, and on
  a tick (every `tick_s`) when the controller's violation check (`needs_replan`) asks for one;
  at most one re-plan is in flight, and a new one starts at most every `min_replan_gap_s`;
* a re-plan sees the queue when it starts and is published `planning_latency_s` later (by
  default the planner's time limit for `milp`, 0 for heuristic planners); meanwhile agents keep
  reconciling against the previous plan and arrivals wait to be inserted into the new one. The
  solver's real wall time is measured (`wall_s`) but not charged: the virtual clock advances by
  the fixed latency, so runs stay reproducible;
* an arrival joins its nearest planned group (`Controller.on_arrival`) and its instance is
  reconciled; an instance is also reconciled whenever its engine frees capacity (a request ends,
  a model finishes loading) and when a plan is published.

Evicted requests go back to the global queue and stay in their planned group, so the next
reconcile of that group's instance pulls them again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from qlm.agents.actions import Action
from qlm.agents.drain import drain_estimate_s
from qlm.agents.reconcile import (
    QueuedGroup,
    QueuedItem,
    ReconcileInput,
    ReconcileOptions,
    reconcile,
)
from qlm.clock import WallClock
from qlm.config import QlmConfig
from qlm.control.controller import Controller, InstanceView
from qlm.control.plan import PublishedPlan
from qlm.engine.types import EngineEvent, EngineObservation
from qlm.perf.profile import Profile
from qlm.sim.policies.base import (
    NO_ACTIONS,
    SIM_POLICIES,
    Actions,
    BasePolicy,
    SimContext,
    frees_capacity,
)
from qlm.types import Fleet, Request

_TICK = "tick"
_REPLAN = "replan"
_PUBLISH = "publish"


@dataclass(frozen=True, slots=True)
class QlmSettings:
    """When the control loop runs in the simulation, and which ablation it is."""

    tick_s: float = 5.0  # violation check period
    min_replan_gap_s: float = 1.0  # at most one re-plan start per this much virtual time
    planning_latency_s: float | None = None  # None: planner time limit (milp), else 0
    planner: str | None = None  # override config.planner.policy (qlm-edf: "edf")
    reconcile: ReconcileOptions = field(default_factory=ReconcileOptions)
    pin_models: bool = False  # plan as if every loaded instance can hold only its model
    shortcuts: bool = True  # skip agent steps and queue tails that cannot change reconcile


class QlmPolicy(BasePolicy):
    name = "qlm"

    def __init__(self, settings: QlmSettings | None = None, name: str = "qlm") -> None:
        super().__init__()
        self.settings = settings or QlmSettings()
        self.name = name
        self._controller: Controller | None = None
        self._priority: dict[str, int] = {}
        self._plan: PublishedPlan | None = None
        self._instance_of_group: dict[str, str] = {}
        self._latency_s = 0.0
        self._in_flight: PublishedPlan | None = None  # solved, not yet published
        self._deferred: list[Request] = []  # arrivals while a plan is in flight
        self._replan_scheduled = False
        self._last_replan_s = float("-inf")
        self._ticking = False
        self._counts: Counter[str] = Counter()
        self._wall_s = 0.0
        self._wall = WallClock()
        self._kv_swap: dict[str, bool] = {}  # instance -> its engine swaps KV to CPU

    # Hooks

    def start(self, ctx: SimContext) -> Actions:
        super().start(ctx)
        settings = self.settings
        fleet = _pinned(ctx.fleet) if settings.pin_models else ctx.fleet
        planner = settings.planner or ctx.config.planner.policy
        config = _reproducible(ctx.config)
        self._controller = Controller(config, fleet, self._wall, planner_policy=planner)
        self._priority = {c.name: c.priority for c in ctx.config.slo_classes}
        latency = settings.planning_latency_s
        if latency is None:
            latency = ctx.config.planner.time_limit_s if planner == "milp" else 0.0
        self._latency_s = latency
        return NO_ACTIONS

    def on_arrival(self, request: Request) -> Actions:
        self._ensure_ticking()
        if self._in_flight is not None:
            self._deferred.append(request)
            return NO_ACTIONS
        return self._insert(request)

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions:
        if self._plan is None or not frees_capacity(events):
            return NO_ACTIONS
        return self._reconcile(instance_id)

    def on_timer(self, tag: str) -> Actions:
        timers = {_TICK: self._tick, _REPLAN: self._start_replan, _PUBLISH: self._publish}
        return timers[tag]()

    def stats(self) -> Mapping[str, float]:
        return dict(sorted(self._counts.items()))

    def wall_s(self) -> float:
        return self._wall_s

    # When the controller runs

    def _ensure_ticking(self) -> None:
        if not self._ticking:
            self._ticking = True
            self.ctx.call_at(self.now_s() + self.settings.tick_s, _TICK)

    def _tick(self) -> Actions:
        ctx = self.ctx
        busy = ctx.queued() or any(ctx.held(i.id) for i in ctx.fleet.instances)
        if not busy:
            self._ticking = False
            return NO_ACTIONS
        ctx.call_at(self.now_s() + self.settings.tick_s, _TICK)
        if self._in_flight is not None or self._replan_scheduled or not ctx.queued():
            return NO_ACTIONS
        started = self._wall.monotonic_s()
        reason = self.controller.needs_replan(self._snapshot(), self._views(), self.now_s())
        self._wall_s += self._wall.monotonic_s() - started
        self._counts["violation_checks"] += 1
        if reason.needed:
            self._counts["replans_on_check"] += 1
            self._request_replan()
        return NO_ACTIONS

    def _request_replan(self) -> None:
        """Coalesce: one re-plan at a time, at most one start per min_replan_gap_s; it runs
        after every arrival of the current instant (timers follow arrivals)."""
        if self._replan_scheduled or self._in_flight is not None:
            return
        self._replan_scheduled = True
        at_s = max(self.now_s(), self._last_replan_s + self.settings.min_replan_gap_s)
        self.ctx.call_at(at_s, _REPLAN)

    def _start_replan(self) -> Actions:
        self._replan_scheduled = False
        ctx = self.ctx
        queued = self._snapshot()
        if not queued:
            return NO_ACTIONS
        now_s = self.now_s()
        self._last_replan_s = now_s
        started = self._wall.monotonic_s()
        plan = self.controller.replan(queued, self._views(), now_s)
        self._wall_s += self._wall.monotonic_s() - started
        self._counts["replans"] += 1
        self._counts[f"plans_{plan.status or 'unknown'}"] += 1
        self._in_flight = plan
        if self._latency_s <= 0:
            return self._publish()
        ctx.call_at(now_s + self._latency_s, _PUBLISH)
        return NO_ACTIONS

    def _publish(self) -> Actions:
        plan = self._in_flight
        if plan is None:
            return NO_ACTIONS
        self._in_flight = None
        self._adopt(plan)
        deferred, self._deferred = self._deferred, []
        queued = self.ctx.queued()
        for request in deferred:
            if request.id in queued:
                self._insert(request, reconcile_now=False)
        actions: list[Action] = []
        for instance in self.ctx.fleet.instances:
            actions.extend(self._reconcile(instance.id))
        return tuple(actions)

    def _insert(self, request: Request, reconcile_now: bool = True) -> Actions:
        plan = self.controller.on_arrival(request, self.now_s())
        if plan is None:
            self._counts["arrivals_outside_plan"] += 1
            self._request_replan()
            return NO_ACTIONS
        self._counts["arrivals_inserted"] += 1
        self._plan = plan
        if not reconcile_now:
            return NO_ACTIONS
        instance_id = self._instance_of_group.get(_group_with_last(plan, request.id) or "")
        return NO_ACTIONS if instance_id is None else self._reconcile(instance_id)

    def _adopt(self, plan: PublishedPlan) -> None:
        self._plan = plan
        self._instance_of_group = {
            group_id: instance_id
            for instance_id, group_ids in plan.queues.items()
            for group_id in group_ids
        }

    # The agents' step

    def _reconcile(self, instance_id: str) -> tuple[Action, ...]:
        """The agent's step for one instance. Shortcuts (`shortcuts`) that cannot change the
        answer skip observing the engine: a loading engine gets nothing, and without KV
        swapping an instance with nothing queued for it gets nothing."""
        ctx = self.ctx
        if self._plan is None:
            return ()
        if not self.settings.shortcuts:
            return self._decide(ctx.observe(instance_id), self._heads(instance_id, whole=True))
        if ctx.loading(instance_id):
            return ()
        obs: EngineObservation | None = None
        kv_swap = self._kv_swap.get(instance_id)
        if kv_swap is None:
            obs = ctx.observe(instance_id)
            kv_swap = self._kv_swap[instance_id] = obs.supports_kv_swap
        if kv_swap:
            obs = obs or ctx.observe(instance_id)
            heads = self._heads(instance_id, whole=bool(obs.swapped))
        else:
            heads = self._heads(instance_id, whole=False)
            if not heads:
                return ()
            obs = obs or ctx.observe(instance_id)
        return self._decide(obs, heads)

    def _decide(self, obs: EngineObservation, heads: tuple[QueuedGroup, ...]) -> tuple[Action, ...]:
        actions = reconcile(ReconcileInput(obs, heads, self._priority), self.settings.reconcile)
        for action in actions:
            self._counts[f"lso_{type(action).__name__.lower()}"] += 1
        return actions

    def _heads(self, instance_id: str, whole: bool) -> tuple[QueuedGroup, ...]:
        """The instance's virtual queue as its agent sees it: each planned group with its
        members still in the global queue, groups with none left out (reconcile skips them).

        Unless `whole`, only the prefix reconcile can act on is
        built: it pulls at most max_num_seqs requests per round, from the run of groups of the
        loaded model that starts at its head, so groups past that run or past max_num_seqs
        queued members cannot change its answer. (With requests swapped to CPU it compares
        them with every group's class: then the whole queue is needed.)"""
        plan = self._plan
        assert plan is not None
        ctx = self.ctx
        queued = ctx.queued()
        model = ctx.model_of(instance_id)
        swaps_models = self.settings.reconcile.allow_model_swap
        limit = None if whole else ctx.max_num_seqs(instance_id)
        heads: list[QueuedGroup] = []
        seen = 0
        for g in plan.queue_of(instance_id):
            items = tuple(_item(queued[rid]) for rid in g.request_ids if rid in queued)
            if not items:
                continue
            heads.append(QueuedGroup(g.group_id, g.model, g.slo_class, items))
            if limit is None:
                continue
            if not (swaps_models or model is None or g.model == model):
                continue  # reconcile skips it
            if g.model != model:
                break  # reconcile swaps to it or stops pulling here
            seen += len(items)
            if seen >= limit:
                break
        return tuple(heads)

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
            views.append(InstanceView(instance.id, model, drain_estimate_s(obs, profile)))
        return tuple(views)

    @property
    def controller(self) -> Controller:
        if self._controller is None:
            raise RuntimeError("qlm policy used before start()")
        return self._controller


def _item(request: Request) -> QueuedItem:
    """A queued request as the agent's reconcile step sees it (its own class ranks it)."""
    return QueuedItem(
        request.id, request.prompt_tokens, request.max_output_tokens, request.slo_class
    )


def _group_with_last(plan: PublishedPlan, request_id: str) -> str | None:
    """The group an inserted request joined: inserts append, so it is a group's last member."""
    for group in plan.groups.values():
        if group.request_ids and group.request_ids[-1] == request_id:
            return group.group_id
    return None


def _pinned(fleet: Fleet) -> Fleet:
    """The fleet as the no-swap planner sees it: each instance with a model loaded gets a GPU
    type of its own that only that model has a profile for, so the planner can place there only
    that model. Instances without a model keep their real GPU type."""
    instances = []
    profiles: dict[tuple[str, str], Profile] = dict(fleet.profiles)
    for instance in fleet.instances:
        model = instance.loaded_model
        profile = None if model is None else fleet.profile(model, instance)
        if model is None or profile is None:
            instances.append(instance)
            continue
        gpu_type = f"{instance.gpu_type}#{model}"
        profiles[(model, gpu_type)] = replace(profile, gpu_type=gpu_type)
        instances.append(replace(instance, gpu_type=gpu_type))
    return Fleet(tuple(instances), profiles)


def _qlm(**options: object) -> QlmPolicy:
    return QlmPolicy(QlmSettings(**options))  # type: ignore[arg-type]


def _qlm_no_evict(**options: object) -> QlmPolicy:
    settings = QlmSettings(**options)  # type: ignore[arg-type]
    no_evict = replace(settings.reconcile, allow_evict=False)
    return QlmPolicy(replace(settings, reconcile=no_evict), "qlm-no-evict")


def _qlm_no_swap(**options: object) -> QlmPolicy:
    settings = QlmSettings(**options)  # type: ignore[arg-type]
    no_swap = replace(settings.reconcile, allow_model_swap=False)
    return QlmPolicy(replace(settings, reconcile=no_swap, pin_models=True), "qlm-no-swap")


def _qlm_edf(**options: object) -> QlmPolicy:
    return QlmPolicy(replace(QlmSettings(**options), planner="edf"), "qlm-edf")  # type: ignore[arg-type]


SIM_POLICIES.register("qlm")(_qlm)
SIM_POLICIES.register("qlm-no-evict")(_qlm_no_evict)
SIM_POLICIES.register("qlm-no-swap")(_qlm_no_swap)
SIM_POLICIES.register("qlm-edf")(_qlm_edf)


def _reproducible(config: QlmConfig) -> QlmConfig:
    """CP-SAT on a deterministic work budget (as much work as its time limit allows, roughly),
    so a simulation gives the same plans, and the same outputs, on every run."""
    planner = config.planner
    if planner.backend != "cpsat" or planner.deterministic_work is not None:
        return config
    budget = planner.model_copy(update={"deterministic_work": planner.time_limit_s})
    return config.model_copy(update={"planner": budget})
