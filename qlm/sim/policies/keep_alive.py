"""How long an idle instance keeps its model before a swapping baseline may take it
(`serverless`, `logos`): one cold load of that model there, from when it last held nothing.

The ski-rental rule: idling that long costs what one reload does, so the keep-alive never pays
more than twice what the best keep-alive in hindsight would; no constant is fitted to a
workload. Instances count as idle from the start of the run (their initial models were placed
for a reason, and no arrival has been seen yet to say otherwise)."""

from __future__ import annotations

from qlm.types import Fleet, Instance


class KeepAlive:
    def __init__(self) -> None:
        self._idle_since: dict[str, float] = {}  # instance -> when it last held nothing

    def idle_from(self, instance_id: str, now_s: float) -> None:
        """The instance holds nothing from `now_s` (or its model just loaded)."""
        self._idle_since[instance_id] = now_s

    def idle_since(self, instance_id: str) -> float:
        return self._idle_since[instance_id]

    def ends_at_s(self, fleet: Fleet, instance: Instance, model: str | None) -> float:
        """When the instance's keep-alive of `model` (its model) runs out; idle since
        forever for no model."""
        profile = None if model is None else fleet.profile(model, instance)
        if profile is None:
            return self._idle_since[instance.id]
        return self._idle_since[instance.id] + profile.load_s
