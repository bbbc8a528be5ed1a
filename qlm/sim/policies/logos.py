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
  `qlm.agents.drain.drain_estimate_s`) for a busy one, which stops pulling meanwhile. Only
  instances whose own model has nothing queued are candidates: a switch never strands work.
* **What it saves.** m's queued work over its pool seen as one machine
  (`qlm.agents.dispatch.PoolRate`: the pool's seconds per request) ends at W from now; with
  the candidate joining once ready (at r), at r + (W - r) / k, k being how much faster the
  larger pool is. The wait saved is the difference (infinite when no instance serves m).
* **Anti-thrash ratios.** A switch is taken only when the wait saved is at least 1.5x a wake,
  2x a cold load, 3x a drain and load: the competitive ratios the issue names for Logos. The
  model whose head is due first chooses first; among its candidates the one with the most
  wait saved per second of switch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from qlm.agents.actions import Action, LoadModel, Pull
from qlm.agents.dispatch import PoolRate
from qlm.agents.drain import drain_estimate_s
from qlm.agents.queued import QueuedItem
from qlm.engine.types import EngineEvent
from qlm.sim.policies.base import (
    NO_ACTIONS,
    SIM_POLICIES,
    Actions,
    AdmissionBook,
    BasePolicy,
    SimContext,
    frees_capacity,
)
from qlm.sim.policies.deadline_queues import DeadlineQueues
from qlm.types import Instance, Request

WAKE_RATIO, LOAD_RATIO, DRAIN_RATIO = 1.5, 2.0, 3.0


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
        self._switches = 0

    def start(self, ctx: SimContext) -> Actions:
        super().start(ctx)
        for instance in ctx.fleet.instances:
            self._book.refresh(ctx, instance.id)
        return NO_ACTIONS

    def on_arrival(self, request: Request) -> Actions:
        self._queues.push(request)
        return self._serve()

    def on_requeued(self, requests: Sequence[Request]) -> Actions:
        for request in requests:
            self._queues.push(request)
        return self._serve()

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions:
        self._book.on_events(self.ctx, instance_id, events)
        return self._serve() if frees_capacity(events) else NO_ACTIONS

    def stats(self) -> dict[str, float]:
        return {"swaps_started": self._switches}

    def _serve(self) -> Actions:
        ctx = self.ctx
        actions: list[Action] = []
        for instance in ctx.fleet.instances:
            target = self._draining.get(instance.id)
            if target is None:
                actions.extend(self._fill(instance))
            elif self._book.held(instance.id) == 0:  # drained: the switch itself
                del self._draining[instance.id]
                actions.append(LoadModel(instance.id, target))
        for model in self._queues.models_by_head():
            switch = self._best_switch(model, actions)
            if switch is None:
                continue
            self._switches += 1
            if switch.drains:
                self._draining[switch.instance_id] = model
            else:
                actions.append(LoadModel(switch.instance_id, model))
        return tuple(actions)

    def _fill(self, instance: Instance) -> Actions:
        ctx = self.ctx
        model = ctx.model_of(instance.id)
        if model is None or ctx.loading(instance.id):
            return NO_ACTIONS
        book = self._book
        taken = self._queues.pull_while(
            model, lambda r: book.fits(instance.id, r), lambda r: book.admit(instance.id, r)
        )
        return (Pull(instance.id, tuple(r.id for r in taken)),) if taken else NO_ACTIONS

    def _best_switch(self, model: str, planned: Sequence[Action]) -> Switch | None:
        """The candidate with the most wait saved per second of switch, among those whose
        saving reaches their tier's ratio; None when none does."""
        ctx = self.ctx
        busy = {a.instance_id for a in planned} | set(self._draining)
        pool = tuple(i.id for i in self.instances_of(model)) + tuple(
            a.instance_id for a in planned if isinstance(a, LoadModel) and a.model == model
        )
        if self._queues.count(model) <= self._free_slots(pool):
            return None  # its instances have room for all of it
        items = [QueuedItem.of(r) for r in self._queues.queued(model)]
        work_s = sum(self._rate(pool, model).cost_s(item)[0] for item in items) if pool else 0.0
        best: tuple[float, Switch] | None = None
        for instance in ctx.fleet.instances:
            if instance.id in busy or instance.id in pool:
                continue
            switch = self._switch(instance, model)
            if switch is None:
                continue
            saved_s = self._saved_s(model, pool, instance.id, items, work_s, switch.cost_s)
            if saved_s < switch.ratio * switch.cost_s:
                continue
            score = saved_s / max(switch.cost_s, 1e-9)
            if best is None or score > best[0]:
                best = (score, switch)
        return None if best is None else best[1]

    def _switch(self, instance: Instance, model: str) -> Switch | None:
        """What moving the instance to `model` costs; None when it cannot serve the model, is
        loading, or its own model has work queued."""
        ctx = self.ctx
        profile = ctx.fleet.profile(model, instance)
        own = ctx.model_of(instance.id)
        if profile is None or ctx.loading(instance.id) or self._queues.count(own or ""):
            return None
        obs = ctx.observe(instance.id)
        asleep = model in obs.standby_models
        load_s = profile.load_time_s(asleep)
        ratio = WAKE_RATIO if asleep and profile.wake_s is not None else LOAD_RATIO
        if not self._book.held(instance.id):
            return Switch(instance.id, load_s, ratio, drains=False)
        drain_s = drain_estimate_s(obs, self.profile_on(instance.id))
        return Switch(instance.id, drain_s + load_s, DRAIN_RATIO, drains=True)

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

    def _free_slots(self, pool: Sequence[str]) -> int:
        """Free sequence slots of the pool (all of a loading instance's)."""
        ctx = self.ctx
        return sum(
            ctx.max_num_seqs(i) - (0 if ctx.loading(i) else self._book.held(i)) for i in pool
        )
