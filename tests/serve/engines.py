"""Engine test doubles for the agent's tests."""

from __future__ import annotations

from collections.abc import Sequence

from qlm.engine.types import Aborted, EngineEvent, EngineObservation, EngineState
from qlm.types import Request


class ScriptedEngine:
    """An engine that does what the test tells it (a test double): events are pushed, and it
    aborts the first `refuse` submissions with `reason` (as vLLM does with a 400)."""

    def __init__(self, refuse: int = 0, reason: str = "refused") -> None:
        self.events: list[EngineEvent] = []
        self.refuse = refuse
        self.reason = reason
        self.submitted: list[str] = []
        self.aborted: list[str] = []

    @property
    def instance_id(self) -> str:
        return "i0"

    def observe(self) -> EngineObservation:
        return EngineObservation("i0", EngineState.READY, "m7b", (), 0, 100_000, 8)

    def submit(self, request: Request) -> None:
        self.submitted.append(request.id)
        if len(self.submitted) <= self.refuse:
            self.events.append(Aborted(request.id, 1.0, self.reason))

    def abort(self, request_ids: Sequence[str]) -> None:
        """Like the real engines: an Aborted event at once for each id."""
        self.aborted.extend(request_ids)
        self.events.extend(Aborted(rid, 1.0, "aborted") for rid in request_ids)

    def swap_out(self, request_ids: Sequence[str]) -> None: ...

    def swap_in(self, request_ids: Sequence[str]) -> None: ...

    def load_model(self, model: str) -> None: ...

    def poll(self) -> list[EngineEvent]:
        events, self.events = self.events, []
        return events
