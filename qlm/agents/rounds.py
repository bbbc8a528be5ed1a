"""What an agent keeps per request it pulled, and one round's queue updates (token chunks
merged per request, results, running marks), written together at the end of the round; and
the agent's counters."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from qlm.engine.engine_types import Aborted, RequestFinished
from qlm.queue.records import RequestResult, StreamEvent, StreamKind
from qlm.types import Request, RequestState


@dataclass
class Held:
    """A request this agent pulled and its engine runs."""

    request: Request
    dispatched_at_s: float
    attempt: int
    sent_tokens: int = 0
    text: list[str] = field(default_factory=list)
    # An earlier attempt's first token (`Pulled.first_token_at_s`): the result keeps it, as
    # the client saw that token (the simulator keeps a request's first first token too).
    first_token_at_s: float | None = None


@dataclass
class Chunks:
    """Token chunks of one request in one round, merged into one stream event."""

    attempt: int
    offset_tokens: int
    at_s: float
    texts: list[str] = field(default_factory=list)
    num_tokens: int = 0
    extras: dict[str, Any] | None = None

    def event(self, request_id: str) -> StreamEvent:
        text, n = "".join(self.texts), self.num_tokens
        return StreamEvent(
            request_id,
            StreamKind.TOKENS,
            self.attempt,
            self.at_s,
            text,
            n,
            self.offset_tokens,
            extras=self.extras,
        )


@dataclass
class Batch:
    """One round's queue updates, waiting to be written together."""

    running: list[tuple[str, float]] = field(default_factory=list)  # (id, first token at)
    chunks: dict[str, Chunks] = field(default_factory=dict)  # merged, per request
    finished: list[RequestResult] = field(default_factory=list)
    requests: dict[str, Request] = field(default_factory=dict)  # of `finished`, for metrics

    def clear(self) -> None:
        self.running.clear()
        self.chunks.clear()
        self.finished.clear()
        self.requests.clear()


@dataclass
class AgentCounters:
    pulled: int = 0
    completed: int = 0
    evictions: int = 0
    swaps: int = 0
    requeued: int = 0
    fetches: int = 0  # standby fetches started


def finished_result(
    held: Held, event: RequestFinished, instance_id: str, load_wait_s: float
) -> RequestResult:
    """The result of a request the engine finished."""
    return RequestResult(
        request_id=event.request_id,
        state=RequestState.COMPLETED,
        instance_id=instance_id,
        text=event.text or "".join(held.text),
        output_tokens=event.output_tokens,
        finish_reason=event.finish_reason,
        dispatched_at_s=held.dispatched_at_s,
        first_token_at_s=min(event.first_token_at_s, held.first_token_at_s or math.inf),
        finished_at_s=event.at_s,
        prompt_tokens=event.prompt_tokens,
        attempt=held.attempt,
        load_wait_s=load_wait_s,
        extras=event.extras,
    )


def failed_result(
    held: Held, event: Aborted, instance_id: str, load_wait_s: float
) -> RequestResult:
    """The result of a request the engine kept aborting (the agent stops retrying it)."""
    return RequestResult(
        request_id=event.request_id,
        state=RequestState.FAILED,
        instance_id=instance_id,
        dispatched_at_s=held.dispatched_at_s,
        finished_at_s=event.at_s,
        error=f"the engine aborted it {held.attempt} times; last: {event.reason}",
        attempt=held.attempt,
        load_wait_s=load_wait_s,
    )
