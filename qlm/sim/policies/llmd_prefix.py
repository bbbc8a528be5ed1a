"""`llmd-prefix`, llm-d's endpoint picker with its prefix-cache scorer beside the queue and KV
scorers (`llmd` otherwise: priority bands, saturation, no swaps, no eviction).

The prefix scorer gives each instance the share of the request's prompt whose leading blocks
the router believes it holds (llm-d's approximate prefix index: `PrefixIndex`, filled from the
router's own routing, one LRU per instance as large as its KV cache). Weights: the `llmd`
baseline's queue and KV scorers (1 each) and the prefix scorer at 1.5, the ratio of llm-d's
default profile (prefix 3, queue 2).
"""

from __future__ import annotations

from qlm.prefixes.index import PrefixIndex
from qlm.sim.policies.llmd import LlmdPolicy
from qlm.sim.policies.policy_base import SIM_POLICIES, Actions, SimContext
from qlm.types import Request


@SIM_POLICIES.register("llmd-prefix")
class LlmdPrefixPolicy(LlmdPolicy):
    name = "llmd-prefix"

    def __init__(self, prefix_weight: float = 1.5) -> None:
        super().__init__()  # llmd's thresholds and weights
        self.prefix_weight = prefix_weight
        self._index = PrefixIndex()

    def start(self, ctx: SimContext) -> Actions:
        actions = super().start(ctx)
        for instance in ctx.fleet.instances:
            self._index.add_instance(instance.id, ctx.observe(instance.id).kv_capacity_tokens)
        return actions

    def _routed(self, instance_id: str, request: Request) -> None:
        self._index.record(instance_id, request.prefix)

    def _bonus(self, instance_id: str, request: Request) -> float:
        if not request.prefix:
            return 0.0
        matched = self._index.matched_tokens(instance_id, request.prefix)
        return self.prefix_weight * matched / request.prompt_tokens
