"""Engine test doubles for the agent's tests."""

from __future__ import annotations

from collections.abc import Sequence

from qlm.engine.engine_types import (
    Aborted,
    EngineEvent,
    EngineObservation,
    EngineRequest,
    EngineState,
)
from qlm.types import Request


class ScriptedEngine:
    """An engine that does what the test tells it (a test double): events are pushed, and it
    aborts the first `refuse` submissions with `reason` (as vLLM does with a 400)."""

    def __init__(
        self,
        refuse: int = 0,
        reason: str = "refused",
        instance_id: str = "i0",
        max_num_seqs: int = 8,
        runs: bool = False,
        broken_abort: bool = False,
    ) -> None:
        self.events: list[EngineEvent] = []
        self.running: dict[str, EngineRequest] = {}  # with `runs`: what it runs (10 tokens in)
        self.id = instance_id
        self.max_num_seqs = max_num_seqs
        self.runs = runs
        self.broken_abort = broken_abort  # abort raises (a failing engine call)
        self.refuse = refuse
        self.reason = reason
        self.submitted: list[str] = []
        self.aborted: list[str] = []

    @property
    def instance_id(self) -> str:
        return self.id

    def observe(self) -> EngineObservation:
        requests = tuple(self.running.values())
        used = sum(r.context_tokens for r in requests)
        slots = self.max_num_seqs
        return EngineObservation(self.id, EngineState.READY, "m7b", requests, used, 100_000, slots)

    def submit(self, request: Request) -> None:
        self.submitted.append(request.id)
        if len(self.submitted) <= self.refuse:
            self.events.append(Aborted(request.id, 1.0, self.reason))
        elif self.runs:
            fields = (request.slo_class, request.prompt_tokens, request.max_output_tokens, 10)
            self.running[request.id] = EngineRequest(request.id, *fields, True)

    def abort(self, request_ids: Sequence[str]) -> None:
        """Like the real engines: an Aborted event at once for each id."""
        if self.broken_abort:
            raise RuntimeError("abort failed")
        self.aborted.extend(request_ids)
        for rid in request_ids:
            self.running.pop(rid, None)
        self.events.extend(Aborted(rid, 1.0, "aborted") for rid in request_ids)

    def swap_out(self, request_ids: Sequence[str]) -> None: ...

    def swap_in(self, request_ids: Sequence[str]) -> None: ...

    def load_model(self, model: str) -> None: ...

    def poll(self) -> list[EngineEvent]:
        events, self.events = self.events, []
        return events
