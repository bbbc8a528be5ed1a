"""The GlobalQueue protocol: one queue for the whole fleet, in memory or in Redis.

Every state change is atomic in the implementation (a lock in memory, a Lua script in Redis), so
a request is never lost or held by two instances. Times come from the caller's Clock, never from
the queue's host. Implementations: `memory` (the embedded default) and `redis`; one contract
suite (tests/queue/test_contract.py) runs against both.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Protocol

from qlm.control.plan import PublishedPlan
from qlm.queue.listing import RecordFilter, RecordPage
from qlm.queue.records import (
    InstanceStatus,
    Pulled,
    RequestRecord,
    RequestResult,
    StreamEvent,
    StreamKind,
)
from qlm.types import Request, RequestState


class QueueError(RuntimeError):
    """A queue operation was refused."""


class QueueUnavailableError(QueueError):
    """The queue's store did not answer (past its client's retries); retry later. Nothing
    was changed by the operation that raised it, or it is safe to repeat."""


class DuplicateRequestError(QueueError):
    def __init__(self, request_id: str) -> None:
        super().__init__(f"request {request_id!r} already exists")


class QueueFullError(QueueError):
    """The queue holds its configured maximum; retry later. `scope` says which bound refused:
    "queue" (the overall bound), "reserved" (only reserved classes may take the places left)
    or "tenant" (the request's tenant holds its own maximum)."""

    def __init__(self, message: str = "the queue is full", scope: str = "queue") -> None:
        super().__init__(message)
        self.scope = scope


class UnknownRequestError(QueueError, KeyError):
    """No request with this id (never enqueued, or its finished record has expired)."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"unknown request {request_id!r}")
        self.request_id = request_id

    def __str__(self) -> str:
        return str(self.args[0])


class GlobalQueue(Protocol):
    async def enqueue(self, request: Request) -> None:
        """Store a QUEUED request. DuplicateRequestError if the id exists."""
        ...

    async def get(self, request_id: str) -> RequestRecord | None: ...

    async def get_many(self, request_ids: Sequence[str]) -> list[RequestRecord | None]:
        """`get` for each id, in order, in few round trips (a batch job's lines)."""
        ...

    async def queued(self) -> tuple[Request, ...]:
        """Every QUEUED request, in arrival order (the control loop's snapshot)."""
        ...

    async def in_flight(self) -> tuple[RequestRecord, ...]:
        """Every DISPATCHED or RUNNING request with its holder and lease."""
        ...

    async def counts(self) -> Mapping[RequestState, int]: ...

    async def list_records(self, page: RecordFilter) -> RecordPage:
        """The records `page` selects, newest first (qlm/queue/listing.py); finished records
        that expired are not listed."""
        ...

    async def pull(
        self, instance_id: str, request_ids: Sequence[str], lease_s: float, now_s: float
    ) -> tuple[Request, ...]:
        """Atomically move the listed requests that are still QUEUED to DISPATCHED, held by
        instance_id with a lease; returns those moved (the rest were taken or cancelled).
        `pull_counted`'s requests."""
        ...

    async def pull_counted(
        self, instance_id: str, request_ids: Sequence[str], lease_s: float, now_s: float
    ) -> tuple[Pulled, ...]:
        """`pull`, each request moved with its dispatch count after this pull (what an
        agent holds it as: its attempt)."""
        ...

    async def mark_running(
        self, request_id: str, instance_id: str, first_token_at_s: float | None = None
    ) -> bool:
        """DISPATCHED -> RUNNING on the first token, if instance_id holds it. The first
        token's time, when given, is kept as the record's `first_token_at_s` unless an earlier
        attempt's is there already, and later pulls return it (`Pulled`)."""
        ...

    async def renew_leases(
        self, instance_id: str, request_ids: Sequence[str], lease_s: float, now_s: float
    ) -> tuple[str, ...]:
        """Extend the leases instance_id holds among request_ids; returns the others, which
        it has lost (its lease ran out and the request went back to the queue, or the request
        ended): the holder should stop working on them."""
        ...

    async def requeue(
        self, instance_id: str, request_ids: Sequence[str], evicted: bool, now_s: float
    ) -> tuple[str, ...]:
        """Return requests held by instance_id to QUEUED (an eviction counts when evicted);
        emits a REQUEUED stream event for each; returns those moved."""
        ...

    async def expire_leases(self, now_s: float) -> tuple[str, ...]:
        """Requeue every DISPATCHED or RUNNING request whose lease ran out."""
        ...

    async def complete(self, result: RequestResult) -> bool:
        """Record the final result if result.instance_id holds the request and it is not
        terminal; emits the DONE stream event. False (and no change) otherwise: a result is
        recorded exactly once."""
        ...

    async def cancel(self, request_id: str, now_s: float) -> bool:
        """Cancel a request that is not terminal; emits DONE with a CANCELLED result."""
        ...

    async def annotate(self, plan: PublishedPlan) -> None:
        """Record each queued request's group and predicted wait from a plan."""
        ...

    async def publish_plan(self, plan: PublishedPlan) -> PublishedPlan:
        """Store the plan under the next epoch and return it with that epoch."""
        ...

    async def current_plan(self) -> PublishedPlan | None: ...

    async def wait_for_plan(self, newer_than_epoch: int, timeout_s: float) -> bool:
        """Wait until a plan with an epoch above `newer_than_epoch` exists (True at once if
        one does) or `timeout_s` passes (False). Agents sleep on it between rounds."""
        ...

    async def emit(self, event: StreamEvent) -> None:
        """Append to a request's output stream."""
        ...

    async def emit_many(self, events: Sequence[StreamEvent]) -> None:
        """emit() for several events, in order, in one call (one round trip on Redis)."""
        ...

    def stream(self, request_id: str, timeout_s: float | None = None) -> AsyncIterator[StreamEvent]:
        """Every event of a request's output stream from its start; ends after DONE. Raises
        TimeoutError when nothing arrives for timeout_s. The events of `stream_batches`, one
        by one (`one_by_one`)."""
        ...

    def stream_batches(
        self, request_id: str, timeout_s: float | None = None
    ) -> AsyncGenerator[Sequence[StreamEvent], None]:
        """The same events as `stream`, in the batches that were there to read at once (each
        non-empty, in order; the last ends with DONE), so that a relay such as the API's
        token stream writes what arrived together in one piece."""
        ...

    async def wait_for_change(self, timeout_s: float) -> bool:
        """Block until something was enqueued, requeued, cancelled or completed since the
        last call (True), or timeout_s passed (False). For the control loop."""
        ...

    async def report_instance(self, status: InstanceStatus) -> None:
        """Store an agent's latest status of its instance (replaces the previous one)."""
        ...

    async def instances(self) -> tuple[InstanceStatus, ...]:
        """The latest status of every instance that reported, by instance id."""
        ...

    async def try_lead(self, node_id: str, lease_s: float) -> bool:
        """Take or renew the leader lease; True while node_id leads."""
        ...

    async def close(self) -> None: ...


async def one_by_one(
    batches: AsyncGenerator[Sequence[StreamEvent], None],
) -> AsyncIterator[StreamEvent]:
    """A stream's batches as single events; closes the batches when the reader stops early."""
    async with contextlib.aclosing(batches):
        async for batch in batches:
            for event in batch:
                yield event


def through_done(events: Sequence[StreamEvent]) -> tuple[Sequence[StreamEvent], bool]:
    """`events` up to and including the first DONE, and whether there was one."""
    for index, event in enumerate(events):
        if event.kind is StreamKind.DONE:
            return events[: index + 1], True
    return events, False
