"""What the global queue stores and hands around: request records, results, stream events and
the published plan (virtual queues with an epoch). Frozen values with a JSON form, so the
in-memory and Redis queues hold exactly the same data."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any

from qlm.types import PrefixBlock, Request, RequestState

_REQUEST_FIELDS = tuple(f.name for f in fields(Request))
_REQUEST_FIELD_SET = frozenset(_REQUEST_FIELDS)


def request_to_dict(request: Request) -> dict[str, Any]:
    """The request's fields as plain values. Shallow: `sampling` and `messages` are the
    request's own (JSON values, never changed in place); `dataclasses.asdict` deep-copied them
    and was an eighth of the API's CPU per admission."""
    data = {name: getattr(request, name) for name in _REQUEST_FIELDS}
    data["state"] = str(request.state)
    return data


def request_from_dict(data: Mapping[str, Any]) -> Request:
    """Fields this version does not know (written by a newer one, mid-rollout) are left out."""
    known = {k: v for k, v in data.items() if k in _REQUEST_FIELD_SET}
    if "prefix" in known:  # JSON gives the blocks back as lists
        known["prefix"] = tuple(PrefixBlock(key, tokens) for key, tokens in known["prefix"])
    return Request(**{**known, "state": RequestState(data["state"])})


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
    attempt: int = 1  # the dispatch that ended it (> 1: an earlier attempt was let go)
    load_wait_s: float = 0.0  # of its queue wait, its instance loading the model it served it on
    extras: dict[str, Any] | None = None  # tool calls, log probabilities (output_extras.py)

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
    # Its first token's time, kept from the first attempt that made one (`mark_running`): a
    # request evicted after its first token keeps it (the client saw that token).
    first_token_at_s: float | None = None

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def state(self) -> RequestState:
        return self.request.state

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
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


@dataclass(frozen=True, slots=True)
class Pulled:
    """A request an instance just pulled, and how many times it has been pulled in all
    (this pull included): the agent's attempt number, given back by the pull itself so that
    holding a request costs no second read of its record; and, when an earlier attempt made
    its first token, that token's time (the request's result keeps it)."""

    request: Request
    dispatches: int
    # The first token of an earlier attempt (`RequestRecord.first_token_at_s`), else None.
    first_token_at_s: float | None = None


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
    extras: dict[str, Any] | None = None  # the chunk's tool calls, log probabilities

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
    # The engine's prefix-cache tallies since it started (EngineObservation); None: unknown
    prefix_prompt_tokens: int | None = None
    prefix_hit_tokens: int | None = None
    # The prompt-prefix blocks (Request.prefix keys) most recently sent to the engine, most
    # recent first, at most qlm.prefixes.index.REPORTED_KEYS: what its prefix cache
    # probably holds, for the control loop's `prefix_held` (the agent's own PrefixIndex).
    prefix_keys: tuple[int, ...] = ()
    standby_models: tuple[str, ...] = ()  # models asleep there (EngineObservation)
    fetching_models: tuple[str, ...] = ()  # being read into its standby tier
    standby_capacity: int = 0  # models its standby tier holds at most
    # Per SLO class, how long the work admitted to its engine delays a new request's first
    # token (qlm/agents/drain.py start_blocks_by_rank): the other agents' dispatch reads it
    # (qlm/agents/reported_fleet.py ReportedFleet).
    start_blocks_s: tuple[tuple[str, float], ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> InstanceStatus:
        data = json.loads(text)
        data["prefix_keys"] = tuple(data.get("prefix_keys", ()))
        data["standby_models"] = tuple(data.get("standby_models", ()))
        data["fetching_models"] = tuple(data.get("fetching_models", ()))
        data["start_blocks_s"] = tuple((c, float(s)) for c, s in data.get("start_blocks_s", ()))
        return cls(**data)
