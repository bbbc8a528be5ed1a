"""`fcfs`, vLLM-like: static model placement, least-loaded routing, FCFS inside each engine.

Each arrival goes at once to the instance of its model that holds the fewest requests (ties: fleet
order); the engine runs what it holds first come, first served with continuous batching. Models
stay where they were loaded at the start: no swaps, no eviction. A request whose model no
instance has loaded is never served.
"""

from __future__ import annotations

from collections.abc import Sequence

from qlm.agents.actions import Pull
from qlm.engine.engine_types import Aborted, EngineEvent, RequestFinished
from qlm.sim.policies.policy_base import NO_ACTIONS, SIM_POLICIES, Actions, BasePolicy, SimContext
from qlm.types import Request


@SIM_POLICIES.register("fcfs")
class FcfsPolicy(BasePolicy):
    name = "fcfs"

    def __init__(self) -> None:
        super().__init__()
        self._pools: dict[str, list[str]] = {}  # model -> instance ids (static)
        self._load: dict[str, int] = {}  # instance id -> requests held

    def start(self, ctx: SimContext) -> Actions:
        super().start(ctx)
        for instance in ctx.fleet.instances:
            model = ctx.model_of(instance.id)
            self._load[instance.id] = ctx.held(instance.id)
            if model is not None:
                self._pools.setdefault(model, []).append(instance.id)
        return NO_ACTIONS

    def on_arrival(self, request: Request) -> Actions:
        pool = self._pools.get(request.model)
        if not pool:
            return NO_ACTIONS
        target = min(pool, key=self._load.__getitem__)
        self._load[target] += 1
        return (Pull(target, (request.id,)),)

    def on_requeued(self, requests: Sequence[Request]) -> Actions:
        """Requests an engine dropped on its own are routed again, like new arrivals."""
        return tuple(a for r in requests for a in self.on_arrival(r))

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions:
        ended = sum(isinstance(e, RequestFinished | Aborted) for e in events)
        self._load[instance_id] -= ended
        return NO_ACTIONS
