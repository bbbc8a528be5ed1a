"""What a live agent knows of its engine's prefix cache, and the locality it dispatches by.

The agent keeps a `PrefixIndex` of its own instance (every pulled request's prompt-prefix
blocks; forgotten on a model load) and reports its keys in its InstanceStatus; the control
loop turns every instance's report into the plan's `prefix_held` (the loop's
`PrefixHeld`, prefix_held.py), which each agent reads to order, and hold back, its dispatch queue
(qlm/agents/prefix_affinity.py). A pull that sent new blocks makes the next status report go
out early (at most every `EARLY_REPORT_S`), so that the others see it soon.
"""

from __future__ import annotations

from collections.abc import Iterable

from qlm.agents.prefix_affinity import PrefixAffinity
from qlm.agents.prefix_index import PrefixIndex
from qlm.control.plan import PublishedPlan
from qlm.perf.profile import Profile
from qlm.types import Request

EARLY_REPORT_S = 0.1


class AgentPrefixes:
    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self._index: PrefixIndex | None = None
        self._deferred: dict[str, float] = {}  # request -> when this agent first held it back
        self.changed = False  # blocks sent since the last report

    def pulled(self, requests: Iterable[Request], kv_capacity_tokens: int) -> None:
        for request in requests:
            if not request.prefix:
                continue
            if self._index is None:
                self._index = PrefixIndex([(self.instance_id, kv_capacity_tokens)])
            self._index.record(self.instance_id, request.prefix)
            self.changed = True

    def forget(self) -> None:
        """The engine loads another model: its cache is gone."""
        if self._index is not None:
            self._index.forget(self.instance_id)
            self.changed = True

    def report(self) -> tuple[int, ...]:
        """The keys for this status report (InstanceStatus.prefix_keys)."""
        self.changed = False
        return () if self._index is None else self._index.keys(self.instance_id)

    def affinity(
        self, plan: PublishedPlan, profile: Profile | None, now_s: float
    ) -> PrefixAffinity | None:
        """Locality over the plan's `prefix_held` (None when it lists nothing)."""
        held = plan.prefix_held
        if not held or profile is None:
            return None
        return PrefixAffinity(
            self.instance_id,
            lambda item: held.get(item.request_id),
            profile.prefill_s,
            self._deferred,
            now_s,
        )
