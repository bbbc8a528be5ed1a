"""A submitted program as stored: its calls, inputs, deadlines and what it has produced.

A program is running until every call has ended: `completed` when each produced its output,
`failed` when one failed (the calls that use its output, directly or not, fail with the
reason; the others still run), `cancelled` when the client cancelled it (what had not ended
is cancelled). A call runs as the request `<program id>.<call name>` (no call name holds a
dot), so a runner step repeated after a crash finds it instead of queueing it twice. A
call's output is copied here when it ends, so it outlives the queue's record. Frozen values;
a change is a new value (`replace`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from qlm.programs.deadlines import CallDeadline
from qlm.programs.graph import ProgramCall, ProgramGraph, ProgramLimits

Json = dict[str, Any]
UNCHECKED = ProgramLimits(10**9, 10**9, 10**9)  # the API checked its limits at submission


class ProgramStatus(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self is not ProgramStatus.RUNNING


class CallState(enum.StrEnum):
    WAITING = "waiting"  # for its inputs
    QUEUED = "queued"  # a request in the queue or an engine (its record says which)
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Program:
    id: str
    tenant: str
    created_at_s: float
    slo_class: str | None  # the calls' class; None: the API's default class
    deadline_s: float | None  # end to end, from creation; None: each call its class's
    calls: tuple[ProgramCall, ...]  # as submitted
    inputs: Mapping[str, str]
    deadlines: Mapping[str, CallDeadline] = field(default_factory=dict)
    status: ProgramStatus = ProgramStatus.RUNNING
    queued: tuple[str, ...] = ()  # calls sent to the queue, in the order sent
    outputs: Mapping[str, str] = field(default_factory=dict)  # ended calls' text
    errors: Mapping[str, str] = field(default_factory=dict)  # failed calls' reasons
    finished_at_s: float | None = None

    def request_id(self, call: str) -> str:
        return f"{self.id}.{call}"

    def graph(self) -> ProgramGraph:
        return ProgramGraph.of(self.calls, tuple(self.inputs), UNCHECKED)

    def state_of(self, call: str) -> CallState:
        if call in self.outputs:
            return CallState.COMPLETED
        if call in self.errors:
            return CallState.FAILED
        return CallState.QUEUED if call in self.queued else CallState.WAITING

    def value(self, name: str) -> str | None:
        """A variable's value: an input's, or an ended call's output; None while unknown."""
        return self.inputs.get(name, self.outputs.get(name))

    def to_dict(self) -> Json:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "created_at_s": self.created_at_s,
            "slo_class": self.slo_class,
            "deadline_s": self.deadline_s,
            "calls": [_call_dict(c) for c in self.calls],
            "inputs": dict(self.inputs),
            "deadlines": {k: [d.ttft_s, d.done_s] for k, d in self.deadlines.items()},
            "status": self.status.value,
            "queued": list(self.queued),
            "outputs": dict(self.outputs),
            "errors": dict(self.errors),
            "finished_at_s": self.finished_at_s,
        }

    @classmethod
    def from_dict(cls, data: Json) -> Program:
        return cls(
            id=data["id"],
            tenant=data["tenant"],
            created_at_s=data["created_at_s"],
            slo_class=data["slo_class"],
            deadline_s=data["deadline_s"],
            calls=tuple(ProgramCall(**c) for c in data["calls"]),
            inputs=data["inputs"],
            deadlines={k: CallDeadline(*v) for k, v in data["deadlines"].items()},
            status=ProgramStatus(data["status"]),
            queued=tuple(data["queued"]),
            outputs=data["outputs"],
            errors=data["errors"],
            finished_at_s=data["finished_at_s"],
        )


def _call_dict(call: ProgramCall) -> Json:
    return {
        "name": call.name,
        "model": call.model,
        "prompt": call.prompt,
        "max_tokens": call.max_tokens,
        "sampling": dict(call.sampling),
    }
