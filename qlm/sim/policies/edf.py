"""`edf`: one global queue in earliest-TTFT-deadline order.

Requests wait in the global queue, one deadline-ordered heap per model. An instance takes the
earliest-deadline request of its model while it has a free sequence slot and KV room for the
request's prompt plus output cap (`AdmissionBook`, the same admission budget QLM's agents use),
so engines never queue or preempt internally and the global order holds. Among instances with
room, the one with the most free KV takes it (ties: fleet order). Strict order: a head that fits
nowhere blocks the requests behind it.

Model swaps, kept simple: an instance that is idle (holds nothing) and has no queued request of
its own model switches to the model of the earliest-deadline queued request that it can hold,
when that model's queue is longer than the free sequence slots of its instances (those loading
it count with all their slots). No eviction.
"""

from __future__ import annotations

from collections.abc import Sequence

from qlm.agents.actions import Action, LoadModel
from qlm.engine.engine_types import EngineEvent
from qlm.sim.policies.deadline_queues import DeadlineQueues, fill
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


@SIM_POLICIES.register("edf")
class EdfPolicy(BasePolicy):
    name = "edf"

    def __init__(self) -> None:
        super().__init__()
        self._queues = DeadlineQueues()
        self._book = AdmissionBook()
        self._swaps = 0

    def start(self, ctx: SimContext) -> Actions:
        super().start(ctx)
        for instance in ctx.fleet.instances:
            self._book.refresh(ctx, instance.id)
        return NO_ACTIONS

    def on_arrival(self, request: Request) -> Actions:
        self._queues.push(request)
        head = self._queues.head(request.model)
        assert head is not None
        ready = [i for i in self.instances_of(request.model) if not self.ctx.loading(i.id)]
        book = self._book
        room = [i for i in ready if book.fits(i.id, head)]
        if not room:
            return self._swap_idle()
        best = max(room, key=lambda i: book.free_kv_tokens(i.id))  # the first of equals
        return self._fill(best)

    def on_requeued(self, requests: Sequence[Request]) -> Actions:
        for request in requests:
            self._queues.push(request)
        return NO_ACTIONS

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions:
        self._book.on_events(self.ctx, instance_id, events)
        if not frees_capacity(events):
            return NO_ACTIONS
        pulled = self._fill(self.ctx.fleet.instance(instance_id))
        return pulled or self._swap_idle()

    def stats(self) -> dict[str, float]:
        return {"swaps_started": self._swaps}

    def _fill(self, instance: Instance) -> Actions:
        return fill(self.ctx, instance, self._queues, self._book)

    def _swap_idle(self) -> Actions:
        """Idle instances whose model has nothing queued switch to the most urgent model whose
        queue is longer than the free room of its instances."""
        ctx = self.ctx
        actions: list[Action] = []
        for instance in ctx.fleet.instances:
            model = ctx.model_of(instance.id)
            if ctx.held(instance.id) or ctx.loading(instance.id) or self._queues.count(model or ""):
                continue
            target = self._urgent_model_short_of_room(instance, actions)
            if target is not None:
                actions.append(LoadModel(instance.id, target))
                self._swaps += 1
        return tuple(actions)

    def _urgent_model_short_of_room(
        self, instance: Instance, planned: Sequence[Action]
    ) -> str | None:
        fleet = self.ctx.fleet
        for model in self._queues.models_by_head():
            if not fleet.can_serve(instance, model):
                continue
            if self._queues.count(model) > self.room_for(model, planned):
                return model
        return None
