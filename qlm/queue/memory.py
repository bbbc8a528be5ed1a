"""The embedded GlobalQueue: everything in one process's memory.

Atomicity comes from asyncio's single thread: no method awaits between reading and writing
state, so every state change runs to the end before another coroutine sees the queue. Readers
of streams and of `wait_for_change` wait on asyncio Events that a change sets and replaces.
Use one MemoryQueue from one event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace

from qlm.clock import Clock, WallClock
from qlm.control.plan import PublishedPlan
from qlm.queue.bounds import QueueBounds
from qlm.queue.listing import RecordFilter, RecordPage, take_page
from qlm.queue.memory_streams import MemoryStreams, Signal
from qlm.queue.queue_protocol import (
    DuplicateRequestError,
    QueueError,
    one_by_one,
)
from qlm.queue.records import (
    InstanceStatus,
    Pulled,
    RequestRecord,
    RequestResult,
    StreamEvent,
    StreamKind,
    cancelled_result,
    check_result,
    done_event,
    requeued_event,
)
from qlm.types import TRANSITIONS, Request, RequestState

IN_FLIGHT = frozenset({RequestState.DISPATCHED, RequestState.RUNNING})


@dataclass(frozen=True, slots=True)
class MemoryQueueConfig:
    """Bounds of the embedded queue. None means unbounded. The queued-request bounds are
    those of qlm.queue.bounds.QueueBounds."""

    max_queued: int | None = None  # QUEUED requests at most; enqueue raises QueueFullError
    max_finished_records: int | None = 100_000  # oldest terminal records (and streams) dropped
    max_queued_per_tenant: int | None = None  # QUEUED requests of one tenant at most
    reserved_queued: int = 0  # places of max_queued only reserved_classes may take
    reserved_classes: frozenset[str] = frozenset({"interactive"})

    @property
    def bounds(self) -> QueueBounds:
        return QueueBounds(
            self.max_queued,
            self.max_queued_per_tenant,
            self.reserved_queued,
            frozenset(self.reserved_classes),
        )


class MemoryQueue:
    """The in-memory GlobalQueue (qlm.queue.queue_protocol.GlobalQueue)."""

    def __init__(
        self, options: MemoryQueueConfig | None = None, clock: Clock | None = None
    ) -> None:
        self.options = options or MemoryQueueConfig()
        self._bounds = self.options.bounds
        self._clock: Clock = clock or WallClock()  # only for the leader lease
        self._records: dict[str, RequestRecord] = {}
        self._seq: dict[str, int] = {}  # arrival order, kept across requeues
        self._next_seq = 0
        self._queued: dict[str, None] = {}  # QUEUED ids; in seq order unless _queued_dirty
        self._queued_dirty = False
        self._in_flight: dict[str, None] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._counts: dict[RequestState, int] = dict.fromkeys(RequestState, 0)
        self._tenant_queued: dict[str, int] = {}  # QUEUED requests per tenant (none at 0)
        self._streams = MemoryStreams()
        self._plan: PublishedPlan | None = None
        self._epoch = 0
        self._plan_signal = Signal()
        self._changes = 0
        self._changes_seen = 0
        self._change_signal = Signal()
        self._instances: dict[str, InstanceStatus] = {}
        self._leader: tuple[str, float] | None = None  # node id, lease end (monotonic)

    # -- reads --------------------------------------------------------------------------

    async def get(self, request_id: str) -> RequestRecord | None:
        return self._records.get(request_id)

    async def get_many(self, request_ids: Sequence[str]) -> list[RequestRecord | None]:
        return [self._records.get(rid) for rid in request_ids]

    async def list_records(self, page: RecordFilter) -> RecordPage:
        # Records are kept in enqueue order (a state change rewrites a value in place).
        return take_page(((self._seq[i], self._records[i]) for i in reversed(self._records)), page)

    async def queued(self) -> tuple[Request, ...]:
        if self._queued_dirty:
            self._queued = dict.fromkeys(sorted(self._queued, key=self._seq.__getitem__))
            self._queued_dirty = False
        return tuple(self._records[i].request for i in self._queued)

    async def in_flight(self) -> tuple[RequestRecord, ...]:
        return tuple(self._records[i] for i in self._in_flight)

    async def counts(self) -> Mapping[RequestState, int]:
        return dict(self._counts)

    async def current_plan(self) -> PublishedPlan | None:
        return self._plan

    # -- state changes (no await inside: each runs atomically) ---------------------------

    async def enqueue(self, request: Request) -> None:
        if request.state is not RequestState.QUEUED:
            raise QueueError(f"request {request.id!r}: only QUEUED requests can be enqueued")
        if request.id in self._records:
            raise DuplicateRequestError(request.id)
        tenant = request.tenant
        refusal = self._bounds.refusal(
            request.slo_class, len(self._queued), tenant, self._tenant_queued.get(tenant, 0)
        )
        if refusal is not None:
            raise refusal
        self._records[request.id] = RequestRecord(request)
        self._count_tenant(tenant, 1)
        self._seq[request.id] = self._next_seq
        self._next_seq += 1
        self._queued[request.id] = None
        self._counts[RequestState.QUEUED] += 1
        self._streams.open(request.id)
        self._changed()

    async def pull(
        self, instance_id: str, request_ids: Sequence[str], lease_s: float, now_s: float
    ) -> tuple[Request, ...]:
        return tuple(
            p.request for p in await self.pull_counted(instance_id, request_ids, lease_s, now_s)
        )

    async def pull_counted(
        self, instance_id: str, request_ids: Sequence[str], lease_s: float, now_s: float
    ) -> tuple[Pulled, ...]:
        moved: list[Pulled] = []
        for rid in request_ids:
            record = self._records.get(rid)
            if record is None or record.state is not RequestState.QUEUED:
                continue
            record = self._set_state(record, RequestState.DISPATCHED)
            record = replace(
                record,
                instance_id=instance_id,
                lease_expires_at_s=now_s + lease_s,
                dispatches=record.dispatches + 1,
            )
            self._records[rid] = record
            moved.append(Pulled(record.request, record.dispatches, record.first_token_at_s))
        return tuple(moved)

    async def mark_running(
        self, request_id: str, instance_id: str, first_token_at_s: float | None = None
    ) -> bool:
        record = self._records.get(request_id)
        if record is None or record.instance_id != instance_id or record.state not in IN_FLIGHT:
            return False
        if record.state is RequestState.DISPATCHED:
            record = self._records[request_id] = self._set_state(record, RequestState.RUNNING)
        if record.first_token_at_s is None and first_token_at_s is not None:
            self._records[request_id] = replace(record, first_token_at_s=first_token_at_s)
        return True

    async def renew_leases(
        self, instance_id: str, request_ids: Sequence[str], lease_s: float, now_s: float
    ) -> tuple[str, ...]:
        lost: list[str] = []
        for rid in request_ids:
            record = self._records.get(rid)
            if record is not None and self._holds(record, instance_id):
                self._records[rid] = replace(record, lease_expires_at_s=now_s + lease_s)
            else:
                lost.append(rid)
        return tuple(lost)

    async def requeue(
        self, instance_id: str, request_ids: Sequence[str], evicted: bool, now_s: float
    ) -> tuple[str, ...]:
        moved: list[str] = []
        for rid in request_ids:
            record = self._records.get(rid)
            if record is not None and self._holds(record, instance_id):
                self._back_to_queue(record, evicted, now_s)
                moved.append(rid)
        if moved:
            self._changed()
        return tuple(moved)

    async def expire_leases(self, now_s: float) -> tuple[str, ...]:
        expired = [
            record
            for rid in self._in_flight
            if (record := self._records[rid]).lease_expires_at_s is not None
            and record.lease_expires_at_s <= now_s
        ]
        for record in expired:
            self._back_to_queue(record, False, now_s)
        if expired:
            self._changed()
        return tuple(r.id for r in expired)

    async def complete(self, result: RequestResult) -> bool:
        check_result(result)
        record = self._records.get(result.request_id)
        if record is None or record.state.is_terminal or record.instance_id != result.instance_id:
            return False
        if result.state is RequestState.COMPLETED and record.state is RequestState.DISPATCHED:
            record = self._set_state(record, RequestState.RUNNING)  # first token came with the end
        if result.state not in TRANSITIONS[record.state]:
            return False
        self._finish(record, result)
        return True

    async def cancel(self, request_id: str, now_s: float) -> bool:
        record = self._records.get(request_id)
        if record is None or record.state.is_terminal:
            return False
        self._finish(record, cancelled_result(request_id, now_s))
        return True

    async def annotate(self, plan: PublishedPlan) -> None:
        for group in plan.groups.values():
            for rid in group.request_ids:
                self._annotate_one(rid, group.group_id, plan.forecast.predicted_wait_s.get(rid))

    async def publish_plan(self, plan: PublishedPlan) -> PublishedPlan:
        self._epoch += 1
        self._plan = plan.with_epoch(self._epoch)
        self._plan_signal.fire()
        return self._plan

    async def wait_for_plan(self, newer_than_epoch: int, timeout_s: float) -> bool:
        if self._plan is None or self._epoch <= newer_than_epoch:
            await self._plan_signal.wait(timeout_s)
        return self._plan is not None and self._epoch > newer_than_epoch

    async def emit(self, event: StreamEvent) -> None:
        if event.kind is StreamKind.DONE:
            raise QueueError("DONE is emitted by complete() or cancel(), not by emit()")
        record = self._records.get(event.request_id)
        if record is None or record.state.is_terminal:
            return  # a late chunk from an attempt that no longer counts
        self._append(event)

    async def emit_many(self, events: Sequence[StreamEvent]) -> None:
        for event in events:
            await self.emit(event)

    # -- waiting ------------------------------------------------------------------------

    def stream(self, request_id: str, timeout_s: float | None = None) -> AsyncIterator[StreamEvent]:
        return one_by_one(self._streams.read(request_id, timeout_s))

    def stream_batches(
        self, request_id: str, timeout_s: float | None = None
    ) -> AsyncGenerator[Sequence[StreamEvent], None]:
        return self._streams.read(request_id, timeout_s)

    async def wait_for_change(self, timeout_s: float) -> bool:
        if self._changes == self._changes_seen:
            await self._change_signal.wait(timeout_s)
        changed = self._changes != self._changes_seen
        self._changes_seen = self._changes
        return changed

    async def report_instance(self, status: InstanceStatus) -> None:
        self._instances[status.instance_id] = status

    async def instances(self) -> tuple[InstanceStatus, ...]:
        return tuple(self._instances[i] for i in sorted(self._instances))

    async def try_lead(self, node_id: str, lease_s: float) -> bool:
        now_s = self._clock.monotonic_s()
        if self._leader is not None and self._leader[0] != node_id and self._leader[1] > now_s:
            return False
        self._leader = (node_id, now_s + lease_s)
        return True

    async def close(self) -> None:
        """Nothing to release; the data lives as long as the object."""

    # -- helpers ------------------------------------------------------------------------

    def _set_state(self, record: RequestRecord, to: RequestState) -> RequestRecord:
        src = record.state
        record = replace(record, request=record.request.transition(to))
        self._counts[src] -= 1
        self._counts[to] += 1
        self._index(record.id, src, remove=True)
        self._index(record.id, to, remove=False)
        if RequestState.QUEUED in (src, to) and src is not to:
            self._count_tenant(record.request.tenant, 1 if to is RequestState.QUEUED else -1)
        self._records[record.id] = record
        return record

    def _count_tenant(self, tenant: str, delta: int) -> None:
        left = self._tenant_queued.get(tenant, 0) + delta
        if left:
            self._tenant_queued[tenant] = left
        else:
            self._tenant_queued.pop(tenant, None)  # idle tenants take no memory

    def _index(self, rid: str, state: RequestState, *, remove: bool) -> None:
        if state is RequestState.QUEUED:
            if remove:
                del self._queued[rid]
            else:
                self._queued_dirty = self._queued_dirty or bool(
                    self._queued and self._seq[next(reversed(self._queued))] > self._seq[rid]
                )
                self._queued[rid] = None
        elif state in IN_FLIGHT:
            if remove:
                del self._in_flight[rid]
            else:
                self._in_flight[rid] = None
        elif not remove:
            self._finished[rid] = None

    @staticmethod
    def _holds(record: RequestRecord, instance_id: str) -> bool:
        return record.state in IN_FLIGHT and record.instance_id == instance_id

    def _back_to_queue(self, record: RequestRecord, evicted: bool, now_s: float) -> None:
        attempt = record.dispatches
        record = self._set_state(record, RequestState.QUEUED)
        self._records[record.id] = replace(
            record,
            instance_id=None,
            lease_expires_at_s=None,
            evictions=record.evictions + int(evicted),
        )
        self._append(requeued_event(record.id, attempt, now_s))

    def _finish(self, record: RequestRecord, result: RequestResult) -> None:
        record = self._set_state(record, result.state)
        record = replace(record, instance_id=None, lease_expires_at_s=None, result=result)
        self._records[record.id] = record
        self._append(done_event(result, record.dispatches))
        self._changed()
        self._drop_old_finished()

    def _annotate_one(self, rid: str, group_id: str, wait_s: float | None) -> None:
        record = self._records.get(rid)
        if record is not None and record.state is RequestState.QUEUED:
            self._records[rid] = replace(record, group_id=group_id, predicted_wait_s=wait_s)

    def _append(self, event: StreamEvent) -> None:
        self._streams.append(event)

    def _changed(self) -> None:
        self._changes += 1
        self._change_signal.fire()

    def _drop_old_finished(self) -> None:
        limit = self.options.max_finished_records
        while limit is not None and len(self._finished) > limit:
            rid, _ = self._finished.popitem(last=False)
            del self._records[rid], self._seq[rid]
            self._streams.drop(rid)
