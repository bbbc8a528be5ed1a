"""`round-robin`, the plainest router: each arrival goes at once to the next instance of its
model in turn; the engine runs what it holds first come, first served (like `fcfs`). Static
placement: no swaps, no eviction. The reference Preble measures latency against."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from qlm.agents.actions import Pull
from qlm.sim.policies.policy_base import NO_ACTIONS, SIM_POLICIES, Actions, BasePolicy, SimContext
from qlm.types import Request


@SIM_POLICIES.register("round-robin")
class RoundRobinPolicy(BasePolicy):
    name = "round-robin"

    def __init__(self) -> None:
        super().__init__()
        self._turns: dict[str, Iterator[str]] = {}

    def start(self, ctx: SimContext) -> Actions:
        super().start(ctx)
        pools: dict[str, list[str]] = {}
        for instance in ctx.fleet.instances:
            model = ctx.model_of(instance.id)
            if model is not None:
                pools.setdefault(model, []).append(instance.id)
        self._turns = {model: itertools.cycle(pool) for model, pool in pools.items()}
        return NO_ACTIONS

    def on_arrival(self, request: Request) -> Actions:
        turn = self._turns.get(request.model)
        return NO_ACTIONS if turn is None else (Pull(next(turn), (request.id,)),)

    def on_requeued(self, requests: Sequence[Request]) -> Actions:
        """Requests an engine dropped on its own are routed again, like new arrivals."""
        return tuple(a for r in requests for a in self.on_arrival(r))
