"""`serverless`: load a model where its requests wait, keep it warm a while, let the least
recently used go (the serverless LLM serving of ServerlessLLM, OSDI'24, and of the keep-alive
rule serverless platforms use).

* **Queues.** One queue per model in arrival order (a serverless platform sees no deadlines).
  An instance serving the model pulls its head while it has a free sequence slot and KV room
  (`AdmissionBook`, as every baseline with a global queue); the instance with the most free KV
  takes a new head.
* **Loading on demand.** A model whose queue is longer than the free slots of the instances
  serving or loading it (those loading count with all their slots) gets one more instance:
  the model whose head has waited longest first. Eligible are the instances that hold
  nothing, whose own model has nothing queued and has been idle past its keep-alive (an
  instance with no model always is). Among them the one where the model is ready soonest
  (asleep in its standby tier: a wake, ServerlessLLM's locality-aware placement), then the
  least recently used.
* **Keep-alive.** An instance keeps its model for as long after its last request ended as a
  cold load of that model takes there (keep_alive.py: the ski-rental rule, never more than
  twice what the best keep-alive in hindsight pays). No constant fitted to a workload.
* No eviction, no preemption, no SLO classes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from qlm.agents.actions import Action, LoadModel, Pull
from qlm.engine.engine_types import EngineEvent
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

KEEP_ALIVE = "keep-alive"  # the timer tag: an instance's keep-alive may have run out


@SIM_POLICIES.register("serverless")
class ServerlessPolicy(BasePolicy):
    name = "serverless"

    def __init__(self) -> None:
        super().__init__()
        self._queues: dict[str, deque[Request]] = {}  # model -> arrival order
        self._book = AdmissionBook()
        self._keep_alive = KeepAlive()
        self._loads = 0

    def start(self, ctx: SimContext) -> Actions:
        super().start(ctx)
        now_s = self.now_s()
        for instance in ctx.fleet.instances:
            self._book.refresh(ctx, instance.id)
            self._keep_alive.idle_from(instance.id, now_s)  # kept alive from the start
            self._look_again(instance)
        return NO_ACTIONS

    def on_arrival(self, request: Request) -> Actions:
        self._queues.setdefault(request.model, deque()).append(request)
        return self._serve()

    def on_requeued(self, requests: Sequence[Request]) -> Actions:
        for request in sorted(requests, key=lambda r: r.arrival_at_s, reverse=True):
            self._queues.setdefault(request.model, deque()).appendleft(request)
        return self._serve()

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions:
        self._book.on_events(self.ctx, instance_id, events)
        if not frees_capacity(events):
            return NO_ACTIONS
        if self._book.held(instance_id) == 0:  # idle from now (or loaded, not yet used)
            self._keep_alive.idle_from(instance_id, self.now_s())
            self._look_again(self.ctx.fleet.instance(instance_id))
        return self._serve()

    def _look_again(self, instance: Instance) -> None:
        """Look again when the instance's keep-alive runs out."""
        model = self.ctx.model_of(instance.id)
        if model is not None:
            self.ctx.call_at(
                self._keep_alive.ends_at_s(self.ctx.fleet, instance, model), KEEP_ALIVE
            )

    def on_timer(self, tag: str) -> Actions:
        return self._serve() if tag == KEEP_ALIVE else NO_ACTIONS

    def stats(self) -> dict[str, float]:
        return {"swaps_started": self._loads}

    def _serve(self) -> Actions:
        """Every ready instance pulls what it has room for; then models still short of room
        get an instance each, longest-waiting head first."""
        actions: list[Action] = []
        for instance in self.ctx.fleet.instances:
            actions.extend(self._fill(instance))
        waiting = sorted(
            (queue[0].arrival_at_s, model) for model, queue in self._queues.items() if queue
        )
        for _, model in waiting:
            if len(self._queues[model]) > self.room_for(model, actions, self._book.held):
                target = self._instance_for(model, actions)
                if target is not None:
                    actions.append(LoadModel(target.id, model))
                    self._loads += 1
        return tuple(actions)

    def _fill(self, instance: Instance) -> Actions:
        """Pull the model's queue head while it fits."""
        ctx = self.ctx
        model = ctx.model_of(instance.id)
        queue = self._queues.get(model or "")
        if not queue or ctx.loading(instance.id):
            return NO_ACTIONS
        ids: list[str] = []
        while queue and self._book.fits(instance.id, queue[0]):
            request = queue.popleft()
            self._book.admit(instance.id, request)
            ids.append(request.id)
        return (Pull(instance.id, tuple(ids)),) if ids else NO_ACTIONS

    def _instance_for(self, model: str, planned: Sequence[Action]) -> Instance | None:
        """The eligible instance where `model` is ready soonest, then least recently used."""
        ctx = self.ctx
        now_s = self.now_s()
        taken = {a.instance_id for a in planned}
        best: tuple[float, float, int] | None = None
        chosen = None
        for k, instance in enumerate(ctx.fleet.instances):
            profile = ctx.fleet.profile(model, instance)
            if profile is None or not ctx.fleet.can_serve(instance, model):
                continue
            if instance.id in taken or not self._free(instance, now_s):
                continue
            standby = model in ctx.observe(instance.id).standby_models
            key = (profile.load_time_s(standby), self._keep_alive.idle_since(instance.id), k)
            if best is None or key < best:
                best, chosen = key, instance
        return chosen

    def _free(self, instance: Instance, now_s: float) -> bool:
        """Holds nothing, and its model (if any) has nothing queued and is past its
        keep-alive."""
        ctx = self.ctx
        if ctx.loading(instance.id) or self._book.held(instance.id):
            return False
        model = ctx.model_of(instance.id)
        if model is None:
            return True
        if self._queues.get(model):
            return False
        return now_s >= self._keep_alive.ends_at_s(ctx.fleet, instance, model)
