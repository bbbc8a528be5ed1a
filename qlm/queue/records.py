"""What the global queue stores and hands around: request records, results, stream events and
the published plan (virtual queues with an epoch). Frozen values with a JSON form, so the
in-memory and Redis queues hold exactly the same data."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from qlm.types import Request, RequestState


def request_to_dict(request: Request) -> dict[str, Any]:
    data = asdict(request)
    data["state"] = str(request.state)
    return data


def request_from_dict(data: Mapping[str, Any]) -> Request:
    return Request(**{**data, "state": RequestState(data["state"])})


@dataclass(frozen=True, slots=True)
class RequestResult:
    """The outcome of one request, reported once by the agent that ran it."""

    request_id: str
    state: RequestState  # COMPLETED, FAILED or CANCELLED
    instance_id: str | None
    text: str = ""
    output_tokens: int = 0
    finish_reason: str = "length"
    dispatched_at_s: float | None = None
    first_token_at_s: float | None = None
    finished_at_s: float | None = None
    error: str | None = None
    prompt_tokens: int | None = None  # counted by the engine (None: the API's estimate holds)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = str(self.state)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestResult:
        return cls(**{**data, "state": RequestState(data["state"])})


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """Everything the queue knows about one request."""

    request: Request  # its state is the request's lifecycle state
    instance_id: str | None = None  # holder while DISPATCHED or RUNNING
    lease_expires_at_s: float | None = None
    group_id: str | None = None  # from the latest plan
    predicted_wait_s: float | None = None  # from the latest plan
    dispatches: int = 0  # times pulled into an engine
    evictions: int = 0
    result: RequestResult | None = None

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def state(self) -> RequestState:
        return self.request.state

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["request"] = request_to_dict(self.request)
        data["result"] = None if self.result is None else self.result.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestRecord:
        result = data.get("result")
        return cls(
            **{
                **data,
                "request": request_from_dict(data["request"]),
                "result": None if result is None else RequestResult.from_dict(result),
            }
        )


class StreamKind(StrEnum):
    TOKENS = "tokens"  # a chunk of output text
    DONE = "done"  # the final event: carries the result
    REQUEUED = "requeued"  # the attempt was evicted; output restarts with the next attempt


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event on a request's output stream. `offset_tokens` is the index of the first token
    of this chunk within the attempt, so a reader that already forwarded tokens of an earlier
    attempt can skip what it has sent."""

    request_id: str
    kind: StreamKind
    attempt: int
    at_s: float
    text: str = ""
    num_tokens: int = 0
    offset_tokens: int = 0
    result: RequestResult | None = None

    def to_json(self) -> str:
        data = asdict(self)
        data["kind"] = str(self.kind)
        data["result"] = None if self.result is None else self.result.to_dict()
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> StreamEvent:
        data = json.loads(text)
        result = data.get("result")
        return cls(
            **{
                **data,
                "kind": StreamKind(data["kind"]),
                "result": None if result is None else RequestResult.from_dict(result),
            }
        )


@dataclass(frozen=True, slots=True)
class PlannedGroup:
    """A group in a published plan. prompt_tokens and max_output_tokens run parallel to
    request_ids, so an agent can budget KV without fetching each request."""

    group_id: str
    model: str
    slo_class: str
    request_ids: tuple[str, ...]
    prompt_tokens: tuple[int, ...] = ()
    max_output_tokens: tuple[int, ...] = ()
    slo_classes: tuple[str, ...] = ()  # each member's own class (a group may mix classes)

    def __post_init__(self) -> None:
        n = len(self.request_ids)
        for name in ("prompt_tokens", "max_output_tokens", "slo_classes"):
            if len(getattr(self, name)) not in (0, n):
                raise ValueError(f"group {self.group_id}: {name} must match request_ids")

    def to_dict(self) -> dict[str, Any]:
        """Plain fields (dataclasses.asdict deep-copies every tuple element: too slow for a
        plan published many times a second)."""
        return {
            "group_id": self.group_id,
            "model": self.model,
            "slo_class": self.slo_class,
            "request_ids": list(self.request_ids),
            "prompt_tokens": list(self.prompt_tokens),
            "max_output_tokens": list(self.max_output_tokens),
            "slo_classes": list(self.slo_classes),
        }

    def with_request(
        self, request_id: str, prompt_tokens: int, max_output_tokens: int, slo_class: str
    ) -> PlannedGroup:
        n = len(self.request_ids)
        return replace(
            self,
            request_ids=(*self.request_ids, request_id),
            prompt_tokens=(*(self.prompt_tokens or (1,) * n), prompt_tokens),
            max_output_tokens=(*(self.max_output_tokens or (1,) * n), max_output_tokens),
            slo_classes=(*(self.slo_classes or (self.slo_class,) * n), slo_class),
        )


def _read_only(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping if isinstance(mapping, MappingProxyType) else MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class PublishedPlan:
    """Virtual queues as the control loop publishes them. `epoch` grows with every publish;
    agents ignore plans older than the one they hold."""

    epoch: int
    created_at_s: float
    queues: Mapping[str, tuple[str, ...]]  # instance id -> group ids, in order
    groups: Mapping[str, PlannedGroup]
    policy: str = ""
    status: str = ""
    predicted_wait_s: Mapping[str, float] = field(default_factory=dict)  # by request id
    # When the predicted waits were computed (the last full re-plan): plans derived since
    # (arrivals inserted) move created_at_s but not the waits. None: created_at_s.
    waits_at_s: float | None = None
    # Per group, the predicted wait of its last member. Set on plans cut for agents (only
    # the head of each queue is listed), so that readers still see how long each group is.
    group_wait_s: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A plan derived from another (new epoch, one group grown) shares the mappings it
        # did not change: they are read-only views already, so copying them again would make
        # each arrival cost the size of the whole plan.
        for name in ("queues", "groups", "predicted_wait_s", "group_wait_s"):
            object.__setattr__(self, name, _read_only(getattr(self, name)))

    def with_epoch(self, epoch: int) -> PublishedPlan:
        return replace(self, epoch=epoch)

    def queue_of(self, instance_id: str) -> tuple[PlannedGroup, ...]:
        return tuple(self.groups[g] for g in self.queues.get(instance_id, ()) if g in self.groups)

    def group_of(self, request_id: str) -> str | None:
        for group in self.groups.values():
            if request_id in group.request_ids:
                return group.group_id
        return None

    def to_json(self) -> str:
        return json.dumps(
            {
                "epoch": self.epoch,
                "created_at_s": self.created_at_s,
                "queues": {k: list(v) for k, v in self.queues.items()},
                "groups": {k: g.to_dict() for k, g in self.groups.items()},
                "policy": self.policy,
                "status": self.status,
                "predicted_wait_s": dict(self.predicted_wait_s),
                "waits_at_s": self.waits_at_s,
                "group_wait_s": dict(self.group_wait_s),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> PublishedPlan:
        data = json.loads(text)
        return cls(
            epoch=data["epoch"],
            created_at_s=data["created_at_s"],
            queues={k: tuple(v) for k, v in data["queues"].items()},
            groups={
                k: PlannedGroup(
                    g["group_id"],
                    g["model"],
                    g["slo_class"],
                    tuple(g["request_ids"]),
                    tuple(g.get("prompt_tokens", ())),
                    tuple(g.get("max_output_tokens", ())),
                    tuple(g.get("slo_classes", ())),
                )
                for k, g in data["groups"].items()
            },
            policy=data.get("policy", ""),
            status=data.get("status", ""),
            predicted_wait_s=data.get("predicted_wait_s", {}),
            waits_at_s=data.get("waits_at_s"),
            group_wait_s=data.get("group_wait_s", {}),
        )


def check_result(result: RequestResult) -> None:
    """A result must carry a terminal state; anything else is a caller's bug."""
    if not result.state.is_terminal:
        raise ValueError(
            f"request {result.request_id}: a result needs a terminal state, not {result.state}"
        )


def cancelled_result(request_id: str, now_s: float) -> RequestResult:
    """The result recorded when a request is cancelled (by the client or the API)."""
    return RequestResult(
        request_id,
        RequestState.CANCELLED,
        instance_id=None,
        finish_reason="cancelled",
        finished_at_s=now_s,
    )


def requeued_event(request_id: str, attempt: int, at_s: float) -> StreamEvent:
    """Attempt `attempt` (1 for the first pull) ended without a result."""
    return StreamEvent(request_id, StreamKind.REQUEUED, attempt, at_s)


def done_event(result: RequestResult, attempt: int) -> StreamEvent:
    """The last event of a stream. Its time is the result's finish time (0.0 if unset)."""
    at_s = 0.0 if result.finished_at_s is None else result.finished_at_s
    return StreamEvent(result.request_id, StreamKind.DONE, attempt, at_s, result=result)


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """What an agent reports about its instance, for the control loop and the dashboard."""

    instance_id: str
    state: str  # an EngineState value
    model: str | None
    busy_s: float
    running: int
    kv_used_tokens: int
    kv_capacity_tokens: int
    at_s: float
    swaps: int = 0
    evictions: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> InstanceStatus:
        return cls(**json.loads(text))
