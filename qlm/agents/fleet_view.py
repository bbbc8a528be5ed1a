"""`FleetView`: what the one dispatch decision (qlm/agents/decision.py) and its standby rules
(qlm/agents/standby_rules.py) read about the fleet besides the queue they are given. The
simulator's view is exact (qlm/sim/policies/qlm_dispatch.py `SimDispatch`); the live agent's is
its own engine and the other agents' reports (qlm/agents/reported_fleet.py `ReportedFleet`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol


class FleetView(Protocol):
    """What the dispatch decision reads about the fleet (besides the queue it is given)."""

    def model_of(self, instance_id: str) -> str | None:
        """The model the instance holds or is loading (None: none)."""
        ...

    def serving(self, model: str) -> tuple[str, ...]:
        """The instances with `model` loaded and not loading, in fleet order: its pool."""
        ...

    def loading(self, model: str) -> tuple[str, ...]:
        """The instances loading `model` now, in fleet order."""
        ...

    def standby_models(self, instance_id: str) -> Collection[str]:
        """The models asleep in the instance's standby tier (a swap to one is a wake)."""
        ...

    def standby_capacity(self, instance_id: str) -> int:
        """How many models the instance's standby tier holds (0: none; a model it leaves is
        unloaded and comes back with a cold load)."""
        ...

    def blocks_of(self, instance_id: str) -> tuple[float, Mapping[str, float]]:
        """The instance's prefill speed (tokens/s) and, per SLO class, how long the work
        admitted to its engine delays a new request's first token
        (`drain.start_blocks_by_rank`)."""
        ...
