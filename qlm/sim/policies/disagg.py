"""`disagg`, after the prefill/decode (P/D) routing of llm-d, Dynamo and AIBrix on a fleet split
into prefill and decode pools (the fleet file's `role`; qlm/sim/handoff.py carries the KV).

* Conditional disaggregation (Dynamo's rule; llm-d's P/D threshold): a request whose prompt
  exceeds `max_local_prefill_tokens` is prefilled on a prefill instance, when one is not
  saturated; a shorter one, or any when every prefill instance is saturated, is prefilled where
  it decodes (an instance with role decode or both). Both systems subtract the tokens a prefix
  cache already holds; like `llmd`, this router keeps no prefix index, so it counts them all.
* Within the pool chosen, llm-d's scoring and saturation (`llmd`: queue and KV scorers, bands by
  class priority, earliest TTFT deadline first in a band).
* Decode: a handed-off request goes to the decode instance with the most free KV after its
  own (`roomiest_decode`, as llm-d's KV scorer ranks decode pods).
* Static placement: no model swaps, no eviction; on a fleet without roles it is `llmd`.
"""

from __future__ import annotations

from collections.abc import Sequence

from qlm.sim.policies.llmd import LlmdPolicy
from qlm.sim.policies.policy_base import SIM_POLICIES, Actions, SimContext
from qlm.types import InstanceRole, Request

# Dynamo's default max_local_prefill_length: longer prompts are prefilled remotely.
MAX_LOCAL_PREFILL_TOKENS = 1000


@SIM_POLICIES.register("disagg")
class DisaggPolicy(LlmdPolicy):
    name = "disagg"

    def __init__(self, max_local_prefill_tokens: int = MAX_LOCAL_PREFILL_TOKENS) -> None:
        super().__init__()
        if max_local_prefill_tokens < 0:
            raise ValueError("max_local_prefill_tokens must be >= 0")
        self.max_local_prefill_tokens = max_local_prefill_tokens
        self._roles: dict[str, InstanceRole] = {}

    def start(self, ctx: SimContext) -> Actions:
        self._roles = {i.id: i.role for i in ctx.fleet.instances}
        return super().start(ctx)

    def _pick(self, pool: Sequence[str], request: Request) -> str | None:
        prefill = [i for i in pool if self._roles[i] is InstanceRole.PREFILL]
        local = [i for i in pool if self._roles[i] is not InstanceRole.PREFILL]
        if prefill and self.remote_prefill(request):
            target = super()._pick(prefill, request)
            if target is not None or not local:
                return target
        return super()._pick(local, request)

    def remote_prefill(self, request: Request) -> bool:
        """Whether the prompt is long enough to prefill on a prefill instance."""
        return request.prompt_tokens > self.max_local_prefill_tokens
