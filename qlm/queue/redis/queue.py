"""The GlobalQueue in Redis, shared by every API replica, agent and control loop: what each
operation does there.

Every state change is one Lua script (qlm/queue/redis/lua/scripts.py), so it is atomic across
any number of clients. Output streams (streams.py) and plans (plans.py) are served by helpers
this class owns; the key layout and the design are in qlm/queue/README.md. Times come from
the callers' clocks; only the leader lease's expiry is measured by Redis (SET PX), which keeps
leadership safe under clock skew between nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, cast

import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import KeyT, StreamIdT

from qlm.config.redis_config import RedisQueueConfig
from qlm.control.plan import PublishedPlan
from qlm.queue.bounds import QueueBounds
from qlm.queue.listing import RecordFilter, RecordPage
from qlm.queue.queue_protocol import (
    DuplicateRequestError,
    QueueError,
    QueueUnavailableError,
    one_by_one,
)
from qlm.queue.records import (
    InstanceStatus,
    Pulled,
    RequestRecord,
    RequestResult,
    StreamEvent,
    cancelled_result,
    check_result,
    done_event,
    request_from_dict,
)
from qlm.queue.redis.batching import ReplicaWait, TurnPipeline
from qlm.queue.redis.codec import (
    as_hash,
    as_strs,
    block_ms,
    chunks,
    finish_sources,
    num,
    record_from_fields,
    request_json,
    result_json,
    xread_entries,
)
from qlm.queue.redis.connect import blocking_client, commands_client
from qlm.queue.redis.keys import Keys
from qlm.queue.redis.listed_index import list_page
from qlm.queue.redis.lua import scripts
from qlm.queue.redis.plans import PlanBoard
from qlm.queue.redis.streams import OutputStreams
from qlm.types import Request, RequestState

_LIVE = (RequestState.DISPATCHED, RequestState.RUNNING)
_READ_BATCH = 1000  # requests per pipelined read
CHANGES_PER_READ = 1024  # changes-stream entries one wait_for_change reads (it keeps ~1,000)


class RedisQueue:
    """The Redis GlobalQueue (qlm.queue.queue_protocol.GlobalQueue). Several RedisQueue
    objects, in one process or many, with the same URL and key prefix are clients of one queue."""

    def __init__(self, config: RedisQueueConfig, client: redis.Redis | None = None) -> None:
        self.config = config
        self._keys = Keys(config.key_prefix)
        self._bounds = QueueBounds(
            config.max_queued,
            config.max_queued_per_tenant,
            config.reserved_queued,
            config.reserved_classes,
        )
        if client is None:
            self._redis, self._blocking = commands_client(config), blocking_client(config)
        else:
            self._redis, self._blocking = client, client
        self._owns_client = client is None
        # Writes that must not be lost with the primary wait for its replicas (WAIT): the
        # enqueue behind a 202, the pull that gives a request to one instance, requeues,
        # results, and output events (a reader must not miss tokens after a failover).
        self._wait = (
            ReplicaWait(config.replicas_to_ack, config.replica_ack_timeout_s)
            if config.replicas_to_ack
            else None
        )
        # Commands of one event-loop iteration share a round trip (batching.py): the API's
        # enqueues; an agent round's marks, token appends and results; the control loop's
        # read of the queue beside the instances' reports.
        self._turn = TurnPipeline(self._redis, self._wait)
        register = self._redis.register_script
        self._enqueue = register(scripts.ENQUEUE)
        self._pull = register(scripts.PULL)
        self._mark_running = register(scripts.MARK_RUNNING)
        self._renew = register(scripts.RENEW)
        self._requeue = register(scripts.REQUEUE)
        self._finish = register(scripts.FINISH)
        self._annotate = register(scripts.ANNOTATE)
        self._renew_lead = register(scripts.RENEW_LEAD)
        self._queued_requests = register(scripts.QUEUED_REQUESTS)
        self._last_change = "0-0"
        # the last queued() snapshot, by id, and what this object enqueued since
        self._queued_cache: dict[str, Request] = {}
        self._plans = PlanBoard(
            self._redis, self._blocking, self._keys, config.block_chunk_s, self._turn
        )
        self._streams = OutputStreams(
            self._redis, self._blocking, self._keys, config.block_chunk_s, self._turn
        )

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisQueue:
        return cls(RedisQueueConfig(url=url, **options))

    # -- reads --------------------------------------------------------------------------

    async def get(self, request_id: str) -> RequestRecord | None:
        with reachable():
            fields = as_hash(await self._redis.hgetall(self._keys.record(request_id)))
        return record_from_fields(fields) if fields else None

    async def get_many(self, request_ids: Sequence[str]) -> list[RequestRecord | None]:
        found: list[RequestRecord | None] = []
        with reachable():
            for chunk in chunks(list(request_ids), self.config.snapshot_batch):
                async with self._redis.pipeline(transaction=False) as pipe:
                    for rid in chunk:
                        pipe.hgetall(self._keys.record(rid))
                    replies = await pipe.execute()
                for reply in replies:
                    fields = as_hash(reply)
                    found.append(record_from_fields(fields) if fields else None)
        return found

    async def queued(self) -> tuple[Request, ...]:
        """The queued ids in arrival order, then the requests: a request's fields never
        change once enqueued, so only ids this client has not seen queued (or enqueued)
        before are read (in chunks of `snapshot_batch`); the control loop asks every round,
        and a long queue then costs one ZRANGE instead of re-reading and parsing every
        request."""
        ids = as_strs(await self._turn.command("ZRANGE", self._keys.queued, 0, -1))
        known = self._queued_cache
        missing = [rid for rid in ids if rid not in known]
        fetched: dict[str, Request] = {}
        for chunk in chunks(missing, self.config.snapshot_batch):
            text = await self._queued_requests(list(map(self._keys.record, chunk)))
            for data in json.loads(cast(str, text)):
                fetched[data["id"]] = request_from_dict({**data, "state": RequestState.QUEUED})
        # A request pulled between the ZRANGE and its read is left out; one requeued
        # meanwhile shows up in the next snapshot.
        current = {rid: r for rid in ids if (r := known.get(rid) or fetched.get(rid))}
        self._queued_cache = current
        return tuple(current.values())

    async def in_flight(self) -> tuple[RequestRecord, ...]:
        ids = as_strs(await self._redis.zrange(self._keys.leases, 0, -1))
        records = await self._records(ids)
        return tuple(r for r in records if r.state in _LIVE)

    async def list_records(self, page: RecordFilter) -> RecordPage:
        with reachable():
            return await list_page(self._redis, self._keys, page)

    async def _records(self, ids: Sequence[str]) -> list[RequestRecord]:
        records: list[RequestRecord] = []
        for chunk in chunks(ids, _READ_BATCH):
            async with self._redis.pipeline(transaction=False) as pipe:
                for rid in chunk:
                    pipe.hgetall(self._keys.record(rid))
                rows = await pipe.execute()
            records += [record_from_fields(fields) for fields in rows if fields]
        return records

    async def counts(self) -> Mapping[RequestState, int]:
        with reachable():
            stored = as_hash(await self._redis.hgetall(self._keys.counts))
        return {state: int(stored.get(state, 0)) for state in RequestState}

    async def instances(self) -> tuple[InstanceStatus, ...]:
        stored = as_hash(await self._turn.command("HGETALL", self._keys.instances))
        return tuple(InstanceStatus.from_json(stored[i]) for i in sorted(stored))

    # -- state changes: one script each -------------------------------------------------

    async def enqueue(self, request: Request) -> None:
        if request.state is not RequestState.QUEUED:
            raise QueueError(f"request {request.id!r}: only QUEUED requests can be enqueued")
        k = self._keys
        bounds = self._bounds
        limit = bounds.class_limit(request.slo_class)
        tenant_limit = bounds.max_queued_per_tenant
        keys = [
            k.record(request.id),
            k.stream(request.id),
            k.queued,
            k.seq,
            k.counts,
            k.changes,
            k.tenants,
            k.listed(None),
            k.listed(request.tenant),
        ]
        args: list[str | int] = [
            request.id,
            request_json(request),
            -1 if limit is None else limit,
            request.tenant,
            -1 if tenant_limit is None else tenant_limit,
            self.config.max_listed_requests,
        ]
        with reachable():
            outcome = await self._turn.script(self._enqueue, keys, args, acked=True)
        if outcome == -1:
            raise DuplicateRequestError(request.id)
        if outcome == -2:
            scope = "queue" if limit == bounds.max_queued else "reserved"
            raise bounds.full_error(request.slo_class, request.tenant, scope)
        if outcome == -3:
            raise bounds.full_error(request.slo_class, request.tenant, "tenant")
        # A control loop on this object (`qlm serve`) finds it in its next snapshot without
        # reading it back: a request's fields never change once enqueued.
        self._queued_cache[request.id] = request

    async def pull(
        self, instance_id: str, request_ids: Sequence[str], lease_s: float, now_s: float
    ) -> tuple[Request, ...]:
        pulled = await self.pull_counted(instance_id, request_ids, lease_s, now_s)
        return tuple(p.request for p in pulled)

    async def pull_counted(
        self, instance_id: str, request_ids: Sequence[str], lease_s: float, now_s: float
    ) -> tuple[Pulled, ...]:
        if not request_ids:
            return ()
        k = self._keys
        keys = [k.queued, k.leases, k.counts, k.tenants, *map(k.record, request_ids)]
        args: list[str | int] = [instance_id, num(now_s + lease_s), *request_ids]
        flat = await self._turn.script(self._pull, keys, args, acked=True)
        return tuple(
            Pulled(
                request_from_dict({**json.loads(flat[i + 1]), "state": RequestState.DISPATCHED}),
                int(flat[i + 2]),
                float(flat[i + 3]) if flat[i + 3] else None,
            )
            for i in range(0, len(flat), 4)
        )

    async def mark_running(
        self, request_id: str, instance_id: str, first_token_at_s: float | None = None
    ) -> bool:
        keys = [self._keys.record(request_id), self._keys.counts]
        args = [instance_id, "" if first_token_at_s is None else num(first_token_at_s)]
        return bool(await self._turn.script(self._mark_running, keys, args, acked=False))

    async def renew_leases(
        self, instance_id: str, request_ids: Sequence[str], lease_s: float, now_s: float
    ) -> tuple[str, ...]:
        if not request_ids:
            return ()
        keys = [self._keys.leases, *map(self._keys.record, request_ids)]
        lost = await self._renew(keys, [instance_id, num(now_s + lease_s), *request_ids])
        return tuple(as_strs(lost))

    async def requeue(
        self, instance_id: str, request_ids: Sequence[str], evicted: bool, now_s: float
    ) -> tuple[str, ...]:
        mode_args: list[str | int] = ["holder", instance_id, "1" if evicted else "0", num(now_s)]
        return await self._run_requeue(request_ids, mode_args)

    async def expire_leases(self, now_s: float) -> tuple[str, ...]:
        due = as_strs(await self._redis.zrangebyscore(self._keys.leases, "-inf", now_s))
        # The script checks each lease again: one renewed since the read above stays.
        return await self._run_requeue(due, ["lease", "", "0", num(now_s)])

    async def _run_requeue(self, ids: Sequence[str], args: list[str | int]) -> tuple[str, ...]:
        if not ids:
            return ()
        k = self._keys
        keys = [k.queued, k.leases, k.counts, k.changes, k.tenants]
        for rid in ids:
            keys += [k.record(rid), k.stream(rid)]
        return tuple(await self._turn.script(self._requeue, keys, [*args, *ids], acked=True))

    async def complete(self, result: RequestResult) -> bool:
        check_result(result)
        return await self._run_finish(result, "holder")

    async def cancel(self, request_id: str, now_s: float) -> bool:
        with reachable():
            return await self._run_finish(cancelled_result(request_id, now_s), "any")

    async def _run_finish(self, result: RequestResult, mode: str) -> bool:
        k = self._keys
        rid = result.request_id
        keys = [k.record(rid), k.stream(rid), k.queued, k.leases, k.counts, k.changes, k.tenants]
        args: list[str | int] = [
            rid,
            mode,
            result.instance_id or "",
            str(result.state),
            finish_sources(result.state),
            result_json(result),
            num(done_event(result, 0).at_s),
            int(self.config.finished_ttl_s * 1000),
        ]
        return bool(await self._turn.script(self._finish, keys, args, acked=True))

    async def annotate(self, plan: PublishedPlan) -> None:
        targets = {
            rid: group.group_id for group in plan.groups.values() for rid in group.request_ids
        }
        calls = []
        for chunk in chunks(list(targets), self.config.annotate_batch):
            args: list[str | int] = []
            for rid in chunk:
                wait_s = plan.forecast.predicted_wait_s.get(rid)
                args += [targets[rid], "" if wait_s is None else num(wait_s)]
            keys = [self._keys.record(rid) for rid in chunk]
            calls.append(self._turn.script(self._annotate, keys, args, acked=False))
        await asyncio.gather(*calls)  # one pipeline, with a plan published in the same turn

    async def report_instance(self, status: InstanceStatus) -> None:
        await self._redis.hset(self._keys.instances, status.instance_id, status.to_json())

    # -- plans and output streams (plans.py, streams.py) --------------------------------

    async def publish_plan(self, plan: PublishedPlan) -> PublishedPlan:
        return await self._plans.publish(plan)

    async def current_plan(self) -> PublishedPlan | None:
        with reachable():
            return await self._plans.current()

    async def wait_for_plan(self, newer_than_epoch: int, timeout_s: float) -> bool:
        return await self._plans.wait(newer_than_epoch, timeout_s)

    async def emit(self, event: StreamEvent) -> None:
        await self._streams.emit(event)

    async def emit_many(self, events: Sequence[StreamEvent]) -> None:
        await self._streams.emit_many(events)

    def stream(self, request_id: str, timeout_s: float | None = None) -> AsyncIterator[StreamEvent]:
        return one_by_one(self._streams.read(request_id, timeout_s))

    def stream_batches(
        self, request_id: str, timeout_s: float | None = None
    ) -> AsyncGenerator[Sequence[StreamEvent], None]:
        return self._streams.read(request_id, timeout_s)

    # -- the control loop's wake-up and leadership ---------------------------------------

    async def wait_for_change(self, timeout_s: float) -> bool:
        streams: dict[KeyT, StreamIdT] = {self._keys.changes: self._last_change}
        block = block_ms(timeout_s) if timeout_s > 0 else None  # None: do not block
        # One read takes every change since the last call (the stream is trimmed to about
        # 1,000 entries), so the next call waits for a new one; no second round trip to
        # look up the newest.
        reply = xread_entries(
            await self._blocking.xread(streams, count=CHANGES_PER_READ, block=block)
        )
        if not reply:
            return False
        self._last_change = reply[-1][0]
        return True

    async def try_lead(self, node_id: str, lease_s: float) -> bool:
        lease_ms = max(1, int(lease_s * 1000))
        if await self._redis.set(self._keys.leader, node_id, nx=True, px=lease_ms):
            return True
        return bool(await self._renew_lead([self._keys.leader], [node_id, lease_ms]))

    async def close(self) -> None:
        await self._streams.close()
        await self._plans.close()
        if self._owns_client:
            await self._redis.aclose()
            await self._blocking.aclose()


@contextlib.contextmanager
def reachable() -> Iterator[None]:
    """Redis not answering past the client's retries becomes QueueUnavailableError (the API
    answers 503 with Retry-After)."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise QueueUnavailableError(f"Redis is not reachable: {exc}") from exc
