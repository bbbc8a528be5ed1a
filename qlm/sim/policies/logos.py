"""`logos`: swap by tier with anti-thrash ratios (a Logos-style many-model scheduler: models
warm on an instance, asleep in its standby tier, or cold; a switch only when the wait it saves
is a set multiple of what it costs).

* **Queues.** One queue per model in earliest-TTFT-deadline order (a request's urgency grows as
  it waits: priority aging by deadline, with no aging rate to choose). An instance on the model
  pulls the head while it has a free slot and KV room (`AdmissionBook`); the instance with the
  most free KV takes a new head.
* **Tiers and what a switch costs.** Moving an instance to model m costs the time it serves
  nothing: a wake (m asleep in its standby tier, `Profile.wake_s`) or a cold load
  (`Profile.load_s`) for an idle instance, and first its drain (what it holds decoded out,
  `qlm.agents.drain.drain_estimate_s`) for a busy one whose model has had no arrival for one
  cold load of it (a model still arriving is in use), which stops pulling meanwhile. Only
  instances whose own model has nothing queued are candidates (a switch never strands work:
  a drain is called off when its model's requests queue again, and a draining instance counts
  as full for its model),
  and an idle one only past its keep-alive (keep_alive.py: one cold load of its model since
  it last held anything, from the start of the run at first).
* **What it saves.** m's queued work over its pool seen as one machine
  (`qlm.agents.dispatch.PoolRate`: the pool's seconds per request) ends at W from now; with
  the candidate joining once ready (at r), at r + (W - r) / k, k being how much faster the
  larger pool is. The wait saved is the difference (infinite when no instance serves m), up
  to the queued requests' mean time left to their deadlines, times the requests queued
  (request-seconds).
* **What it costs.** The switch's seconds, times the arrivals of the instance's own model
  expected while it is away (the switch and a load back, at the model's rate of the last
  minute) when it is that model's last instance, and at least once: a popular model's only
  instance is not given away for a tail model's one request. A model nothing serves gains at
  least its tier's ratio of the cost per request queued, so it gets any instance whose switch
  strands nothing, and is looked at again every second while its rivals' rates decay.
* **Anti-thrash ratios.** A switch is taken only when the saving is at least 1.5x the cost
  of a wake, 2x a cold load's, 3x a drain and load's: the competitive ratios the issue names
  for Logos. The model whose head is due first chooses first; among its candidates the one
  with the most saving per cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from qlm.agents.actions import Action, LoadModel
from qlm.agents.arrival_rates import ArrivalRates
from qlm.agents.dispatch import PoolRate
from qlm.agents.drain import drain_estimate_s
from qlm.agents.queued import QueuedItem
from qlm.engine.engine_types import EngineEvent
from qlm.sim.policies.deadline_queues import DeadlineQueues, fill
from qlm.sim.policies.keep_alive import KeepAlive
from qlm.sim.policies.policy_base import (
    NO_ACTIONS,
    SIM_POLICIES,
    Actions,
    AdmissionBook,
    BasePolicy,
    SimContext,
    frees_capacity,
)
from qlm.types import Instance, Request

WAKE_RATIO, LOAD_RATIO, DRAIN_RATIO = 1.5, 2.0, 3.0
ARRIVAL_WINDOW_S = 60.0  # the recent arrivals a model's rate is read from
RECHECK, RECHECK_S = "recheck", 1.0  # a model nothing serves is looked at again this often


@dataclass(frozen=True, slots=True)
class Switch:
    """A candidate move of an instance to a model: seconds it serves nothing, the ratio its
    saving must reach, and whether it drains first."""

    instance_id: str
    cost_s: float
    ratio: float
    drains: bool


@SIM_POLICIES.register("logos")
class LogosPolicy(BasePolicy):
    name = "logos"

    def __init__(self) -> None:
        super().__init__()
        self._queues = DeadlineQueues()
        self._book = AdmissionBook()
        self._draining: dict[str, str] = {}  # instance -> the model it moves to once empty
        self._rates: dict[tuple[str, ...], PoolRate] = {}  # (model, *pool) -> its prices
        self._arrivals = ArrivalRates(ARRIVAL_WINDOW_S)  # each model's rate, last minute
        self._last_arrival_s: dict[str, float] = {}  # model -> its latest arrival
        self._recheck_at_s = -math.inf
        self._keep_alive = KeepAlive()
        self._switches = 0

    def start(self, ctx: SimContext) -> Actions:
        super().start(ctx)
        for instance in ctx.fleet.instances:
            self._book.refresh(ctx, instance.id)
            self._keep_alive.idle_from(instance.id, self.now_s())
        return NO_ACTIONS

    def on_arrival(self, request: Request) -> Actions:
        self._queues.push(request)
        budget_s = request.ttft_deadline_at_s - request.arrival_at_s
        self._arrivals.arrived(request.model, request.arrival_at_s, budget_s)
        self._last_arrival_s[request.model] = request.arrival_at_s
        return self._serve()

    def on_requeued(self, requests: Sequence[Request]) -> Actions:
        for request in requests:
            self._queues.push(request)
        return self._serve()

    def on_timer(self, tag: str) -> Actions:
        return self._serve() if tag == RECHECK else NO_ACTIONS

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions:
        self._book.on_events(self.ctx, instance_id, events)
        if not frees_capacity(events):
            return NO_ACTIONS
        if self._book.held(instance_id) == 0:
            self._keep_alive.idle_from(instance_id, self.now_s())
            instance = self.ctx.fleet.instance(instance_id)
            ends_s = self._keep_alive.ends_at_s(
                self.ctx.fleet, instance, self.ctx.model_of(instance_id)
            )
            self.ctx.call_at(ends_s, RECHECK)  # look again when its keep-alive ends
        return self._serve()

    def stats(self) -> dict[str, float]:
        return {"swaps_started": self._switches}

    def _serve(self) -> Actions:
        ctx = self.ctx
        actions: list[Action] = []
        for instance in ctx.fleet.instances:
            target = self._draining.get(instance.id)
            if target is not None and self._queues.count(ctx.model_of(instance.id) or ""):
                del self._draining[instance.id]  # its own model arrived again: it stays
                target = None
            if target is None:
                actions.extend(self._fill(instance))
            elif self._book.held(instance.id) == 0:  # drained: the switch itself
                del self._draining[instance.id]
                actions.append(LoadModel(instance.id, target))
        for model in self._queues.models_by_head():
            switch = self._best_switch(model, actions)
            if switch is None:
                if not self.instances_of(model) and self._recheck_at_s <= self.now_s():
                    # nothing serves it: look again when a keep-alive ends, or as the
                    # rates that held it back decay
                    self._recheck_at_s = self._next_look_s()
                    ctx.call_at(self._recheck_at_s, RECHECK)
                continue
            self._switches += 1
            if switch.drains:
                self._draining[switch.instance_id] = model
            else:
                actions.append(LoadModel(switch.instance_id, model))
        return tuple(actions)

    def _fill(self, instance: Instance) -> Actions:
        return fill(self.ctx, instance, self._queues, self._book)

    def _best_switch(self, model: str, planned: Sequence[Action]) -> Switch | None:
        """The candidate with the most wait saved per second of switch, among those whose
        saving reaches their tier's ratio; None when none does."""
        ctx = self.ctx
        busy = {a.instance_id for a in planned} | set(self._draining)
        pool = tuple(i.id for i in self.instances_of(model) if i.id not in self._draining)
        pool += tuple(
            a.instance_id for a in planned if isinstance(a, LoadModel) and a.model == model
        )
        if self._queues.count(model) <= self.room_for(model, planned, self._held):
            return None  # its instances have room for all of it
        items = [QueuedItem.of(r) for r in self._queues.queued(model)]
        work_s = sum(self._rate(pool, model).cost_s(item)[0] for item in items) if pool else 0.0
        now_s = self.now_s()
        budget_s = sum(max(0.0, i.ttft_deadline_at_s - now_s) for i in items) / len(items)
        best: tuple[float, Switch] | None = None
        for instance in ctx.fleet.instances:
            if instance.id in busy or instance.id in pool:
                continue
            switch = self._switch(instance, model)
            if switch is None:
                continue
            saved_s = self._saved_s(model, pool, instance.id, items, work_s, switch.cost_s)
            each_s = min(saved_s, budget_s)  # up to the deadlines
            if not pool:  # nothing serves it: worth a switch that strands nothing
                each_s = max(each_s, switch.ratio * switch.cost_s)
            gain = len(items) * each_s  # request-seconds
            cost = switch.cost_s * max(1.0, self._stranded(instance, switch.cost_s))
            if gain < switch.ratio * cost:
                continue
            if best is None or gain / max(cost, 1e-9) > best[0]:
                best = (gain / max(cost, 1e-9), switch)
        return None if best is None else best[1]

    def _next_look_s(self) -> float:
        """The next keep-alive end of an idle instance, within `RECHECK_S` from now."""
        ctx, now_s = self.ctx, self.now_s()
        ends = (
            self._keep_alive.ends_at_s(ctx.fleet, i, ctx.model_of(i.id))
            for i in ctx.fleet.instances
            if not self._book.held(i.id)
        )
        return min([e for e in ends if e > now_s] + [now_s + RECHECK_S])

    def _stranded(self, instance: Instance, switch_s: float) -> float:
        """Arrivals of the instance's model expected while it is away (the switch and a
        load back), when it is that model's last instance; each waits about the switch."""
        ctx = self.ctx
        own = ctx.model_of(instance.id)
        if own is None or ctx.serving(own) != (instance.id,):
            return 0.0
        back = ctx.fleet.profile(own, instance)
        back_s = 0.0 if back is None else back.load_time_s(self._tiered(instance.id))
        return self._arrivals.rate_per_s(own, self.now_s()) * (switch_s + back_s)

    def _tiered(self, instance_id: str) -> bool:
        return self.ctx.observe(instance_id).standby_capacity > 0

    def _switch(self, instance: Instance, model: str) -> Switch | None:
        """What moving the instance to `model` costs; None when it cannot serve the model, is
        loading, or its own model has work queued."""
        ctx = self.ctx
        profile = ctx.fleet.profile(model, instance)
        own = ctx.model_of(instance.id)
        if profile is None or not ctx.fleet.can_serve(instance, model):
            return None
        if ctx.loading(instance.id) or self._queues.count(own or ""):
            return None
        idle = not self._book.held(instance.id)
        if idle and self.now_s() < self._keep_alive.ends_at_s(ctx.fleet, instance, own):
            return None  # kept alive (keep_alive.py)
        obs = ctx.observe(instance.id)
        asleep = model in obs.standby_models
        load_s = profile.load_time_s(asleep)
        ratio = WAKE_RATIO if asleep and profile.wake_s is not None else LOAD_RATIO
        if not self._book.held(instance.id):
            return Switch(instance.id, load_s, ratio, drains=False)
        if self._arrived_within(own, instance):
            return None  # its model still arrives: it is in use, not draining
        drain_s = drain_estimate_s(obs, self.profile_on(instance.id))
        return Switch(instance.id, drain_s + load_s, DRAIN_RATIO, drains=True)

    def _arrived_within(self, model: str | None, instance: Instance) -> bool:
        """Whether a request of `model` arrived within one cold load of it on the
        instance (its keep-alive, keep_alive.py)."""
        last_s = self._last_arrival_s.get(model or "")
        profile = None if model is None else self.ctx.fleet.profile(model, instance)
        if last_s is None or profile is None:
            return False
        return last_s > self.now_s() - profile.load_s

    def _saved_s(
        self,
        model: str,
        pool: tuple[str, ...],
        instance_id: str,
        items: Sequence[QueuedItem],
        work_s: float,
        ready_in_s: float,
    ) -> float:
        """How much sooner the model's queued work (`work_s` on `pool` alone) ends with the
        instance joining the pool once ready (infinite when nothing serves the model). The
        larger pool's speed-up is read off the queue's mean request."""
        if not items:
            return 0.0
        if not pool:
            return math.inf
        if work_s <= ready_in_s:
            return 0.0
        mean = QueuedItem(
            "mean",
            round(sum(i.prompt_tokens for i in items) / len(items)),
            round(sum(i.max_output_tokens for i in items) / len(items)),
        )
        joined_s = self._rate((*pool, instance_id), model).cost_s(mean)[0]
        speedup = self._rate(pool, model).cost_s(mean)[0] / max(joined_s, 1e-9)
        return work_s - (ready_in_s + (work_s - ready_in_s) / speedup)

    def _rate(self, pool: tuple[str, ...], model: str) -> PoolRate:
        rate = self._rates.get((model, *pool))
        if rate is None:
            rate = self._rates[(model, *pool)] = PoolRate.of(self.ctx.fleet, pool, model)
        return rate

    def _held(self, instance_id: str) -> int:
        """What the instance holds, as full when it drains away from its model."""
        if instance_id in self._draining:
            return self.ctx.max_num_seqs(instance_id)
        return self._book.held(instance_id)
