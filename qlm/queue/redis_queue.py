"""The GlobalQueue in Redis, shared by every API replica, agent and control loop.

Every state change is one Lua script (qlm/queue/lua/scripts.py), so it is atomic across any
number of clients. Output streams are Redis Streams read from their first entry, so a reader
that starts late still sees everything. The key layout and the design are in
qlm/queue/README.md. Times come from the callers' clocks; only the leader lease's expiry is
measured by Redis (SET PX), which keeps leadership safe under clock skew between nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Literal, cast
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as redis
from pydantic import Field, SecretStr, field_validator, model_validator
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import KeyT, StreamIdT

from qlm.config import StrictModel
from qlm.control.plan import PublishedPlan
from qlm.queue.base import DuplicateRequestError, QueueError, UnknownRequestError
from qlm.queue.bounds import QueueBounds
from qlm.queue.lua import scripts
from qlm.queue.records import (
    InstanceStatus,
    RequestRecord,
    RequestResult,
    StreamEvent,
    StreamKind,
    cancelled_result,
    check_result,
    done_event,
    request_from_dict,
    request_to_dict,
)
from qlm.queue.redis_pokes import StreamPokes
from qlm.types import TRANSITIONS, Request, RequestState

log = logging.getLogger(__name__)
_LIVE = (RequestState.DISPATCHED, RequestState.RUNNING)
_READ_BATCH = 1000  # requests per pipelined read


class RedisQueueConfig(StrictModel):
    """How to reach Redis and how to use it. The URL may carry a user and password
    (redis://user:pass@host:6379/0); rediss:// turns TLS on."""

    url: str = Field(
        default="redis://127.0.0.1:6379/0",
        repr=False,
        description="redis:// or rediss:// (TLS) URL, with optional user:password and db.",
    )
    key_prefix: str = Field(
        default="qlm:", description="Prefix of every key; separates deployments and tests."
    )
    username: str | None = Field(default=None, description="Overrides the URL's user.")
    password: SecretStr | None = Field(default=None, description="Overrides the URL's password.")
    max_queued: int | None = Field(
        default=None, ge=0, description="QUEUED requests at most; enqueue raises QueueFullError."
    )
    max_queued_per_tenant: int | None = Field(
        default=None, ge=0, description="QUEUED requests of one tenant at most."
    )
    reserved_queued: int = Field(
        default=0, ge=0, description="Places of max_queued that only reserved_classes may take."
    )
    reserved_classes: frozenset[str] = Field(
        default=frozenset({"interactive"}), description="SLO classes that may use reserved places."
    )
    finished_ttl_s: float = Field(
        default=24 * 3600.0,
        ge=0,
        description="Finished records and their streams expire after this; 0 keeps them.",
    )
    block_chunk_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="Longest single blocking read; stream readers re-check their request "
        "between chunks.",
    )
    snapshot_batch: int = Field(
        default=2000, ge=1, description="Requests read per script call by queued()."
    )
    annotate_batch: int = Field(
        default=500, ge=1, description="Requests annotated per script call."
    )
    socket_connect_timeout_s: float = Field(default=5.0, gt=0)
    socket_timeout_s: float | None = Field(
        default=None, gt=0, description="Per-command timeout; must exceed block_chunk_s."
    )
    max_connections: int = Field(
        default=64,
        ge=1,
        description="Connections for commands; callers wait for a free one (pool_timeout_s).",
    )
    pool_timeout_s: float = Field(
        default=20.0, gt=0, description="Longest wait for a free command connection."
    )
    max_blocking_connections: int = Field(
        default=10_000,
        ge=1,
        description="Connections for blocking reads: one per open stream() or wait_for_change().",
    )
    health_check_interval_s: float = Field(default=30.0, ge=0)
    retries: int = Field(
        default=10,
        ge=0,
        le=100,
        description="Retries of a command after a connection error or timeout, reconnecting "
        "each time, with jittered exponential backoff: about 6 s in all at the defaults, "
        "which rides out a Redis restart on its AOF.",
    )
    retry_backoff_base_s: float = Field(default=0.05, gt=0, description="First backoff step.")
    retry_backoff_cap_s: float = Field(default=1.0, gt=0, description="Longest backoff step.")
    ssl_ca_certs: str | None = Field(default=None, description="CA bundle for rediss://.")
    ssl_certfile: str | None = Field(default=None, description="Client certificate (mTLS).")
    ssl_keyfile: str | None = Field(default=None, description="Client key (mTLS).")
    ssl_cert_reqs: Literal["required", "optional", "none"] = "required"

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise ValueError("url must start with redis://, rediss:// or unix://")
        return url

    @model_validator(mode="after")
    def _bounds_consistent(self) -> RedisQueueConfig:
        _ = self.bounds  # QueueBounds raises ValueError for inconsistent bounds
        return self

    @property
    def bounds(self) -> QueueBounds:
        return QueueBounds(
            self.max_queued, self.max_queued_per_tenant, self.reserved_queued, self.reserved_classes
        )

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"

    @property
    def redacted_url(self) -> str:
        """The URL without its password, for logs."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return urlunsplit(parts._replace(netloc=netloc))

    @property
    def connect_url(self) -> str:
        """The URL handed to redis-py: without credentials when `username` or `password` is
        set here (redis-py lets the URL's win over keyword arguments)."""
        parts = urlsplit(self.url)
        if (self.username is None and self.password is None) or "@" not in parts.netloc:
            return self.url
        return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for redis.asyncio.Redis.from_url(connect_url, ...)."""
        parts = urlsplit(self.url)
        options: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": self.socket_connect_timeout_s,
            "socket_timeout": self.socket_timeout_s,
            "health_check_interval": self.health_check_interval_s,
            # Both pools need it: a pool built outside Redis() gets no retries by default.
            "retry": Retry(
                ExponentialWithJitterBackoff(
                    cap=self.retry_backoff_cap_s, base=self.retry_backoff_base_s
                ),
                self.retries,
            ),
        }
        if self.username is not None or self.password is not None:
            options["username"] = self.username or parts.username
            options["password"] = (
                parts.password if self.password is None else self.password.get_secret_value()
            )
        if self.tls:
            options["ssl_cert_reqs"] = self.ssl_cert_reqs
            options |= {
                key: value
                for key, value in (
                    ("ssl_ca_certs", self.ssl_ca_certs),
                    ("ssl_certfile", self.ssl_certfile),
                    ("ssl_keyfile", self.ssl_keyfile),
                )
                if value is not None
            }
        return options


class _Keys:
    """Every key the queue uses, under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.queued = f"{prefix}queued"  # zset: id -> arrival sequence
        self.leases = f"{prefix}leases"  # zset: id -> lease expiry (caller's clock)
        self.seq = f"{prefix}seq"  # counter: arrival sequence
        self.counts = f"{prefix}counts"  # hash: state -> count
        self.changes = f"{prefix}changes"  # stream: one entry per change (wait_for_change)
        self.epoch = f"{prefix}epoch"  # counter: plan epochs
        self.plan = f"{prefix}plan"  # hash: epoch, json
        self.plan_changes = f"{prefix}plan-changes"  # stream: one entry per published epoch
        self.instances = f"{prefix}instances"  # hash: instance id -> status JSON
        self.tenants = f"{prefix}tenants"  # hash: tenant -> QUEUED requests (none at 0)
        self.leader = f"{prefix}leader"  # string: node id, with PX expiry

    def record(self, request_id: str) -> str:
        return f"{self.prefix}r:{request_id}"  # hash, fields in qlm/queue/lua/scripts.py

    def stream(self, request_id: str) -> str:
        return f"{self.prefix}s:{request_id}"  # stream of output events


def _num(value: float) -> str:
    """A float as the exact text Redis and Lua will store and parse back."""
    return repr(float(value))


def _sources(to: RequestState) -> str:
    """The states that may move to `to`, as the FINISH script reads them. A request that
    completes while DISPATCHED passes through RUNNING (its first token came with its end)."""
    sources = {src for src, dsts in TRANSITIONS.items() if to in dsts}
    if to is RequestState.COMPLETED:
        sources.add(RequestState.DISPATCHED)
    return " " + " ".join(sorted(sources)) + " "


def _record(fields: Mapping[str, str]) -> RequestRecord:
    request = request_from_dict({**json.loads(fields["req"]), "state": fields["state"]})
    result = fields.get("result")
    return RequestRecord(
        request=request,
        instance_id=fields.get("inst"),
        lease_expires_at_s=_float(fields.get("lease")),
        group_id=fields.get("group"),
        predicted_wait_s=_float(fields.get("wait")),
        dispatches=int(fields.get("disp", 0)),
        evictions=int(fields.get("evic", 0)),
        result=None if result is None else RequestResult.from_dict(json.loads(result)),
    )


def _float(text: str | None) -> float | None:
    return None if text is None else float(text)


def _event(request_id: str, fields: Mapping[str, str]) -> StreamEvent:
    result = fields.get("r")
    return StreamEvent(
        request_id=request_id,
        kind=StreamKind(fields["k"]),
        attempt=int(fields["a"]),
        at_s=float(fields["t"]),
        text=fields.get("x", ""),
        num_tokens=int(fields.get("n", 0)),
        offset_tokens=int(fields.get("o", 0)),
        result=None if result is None else RequestResult.from_dict(json.loads(result)),
    )


def _request_json(request: Request) -> str:
    data = request_to_dict(request)
    del data["state"]  # the record's `state` field is the one source of truth
    return json.dumps(data, separators=(",", ":"))


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    return (items[i : i + size] for i in range(0, len(items), size))


class RedisQueue:
    """The Redis GlobalQueue (qlm.queue.base.GlobalQueue). Several RedisQueue objects, in one
    process or many, with the same URL and key prefix are clients of one queue."""

    def __init__(self, config: RedisQueueConfig, client: redis.Redis | None = None) -> None:
        self.config = config
        self._keys = _Keys(config.key_prefix)
        self._bounds = config.bounds
        # Commands share a bounded pool that makes callers wait; blocking reads (streams,
        # wait_for_change) hold a connection each, so they get their own pool and can never
        # starve the commands.
        self._redis: redis.Redis = client or redis.Redis.from_pool(
            redis.BlockingConnectionPool.from_url(
                config.connect_url,
                max_connections=config.max_connections,
                timeout=config.pool_timeout_s,
                **config.client_options(),
            )
        )
        self._blocking: redis.Redis = client or redis.Redis.from_url(
            config.connect_url,
            max_connections=config.max_blocking_connections,
            **config.client_options(),
        )
        self._owns_client = client is None
        register = self._redis.register_script
        self._enqueue = register(scripts.ENQUEUE)
        self._enqueue_batch = _GroupCommit(self._redis, self._enqueue)
        self._pull = register(scripts.PULL)
        self._mark_running = register(scripts.MARK_RUNNING)
        self._renew = register(scripts.RENEW)
        self._requeue = register(scripts.REQUEUE)
        self._finish = register(scripts.FINISH)
        self._emit = register(scripts.EMIT)
        self._annotate = register(scripts.ANNOTATE)
        self._publish_plan = register(scripts.PUBLISH_PLAN)
        self._renew_lead = register(scripts.RENEW_LEAD)
        self._queued_requests = register(scripts.QUEUED_REQUESTS)
        self._last_change = "0-0"
        self._plan_cache: PublishedPlan | None = None
        self._queued_cache: dict[str, Request] = {}  # the last queued() snapshot, by id
        self._plan_epoch = 0  # newest epoch the watcher saw (0: none yet)
        self._plan_signal = asyncio.Event()
        self._plan_watcher: asyncio.Task[None] | None = None
        self._plan_heard_at_s = float("-inf")  # when the watcher's last read returned
        self._pokes = StreamPokes(self._blocking, f"{self._keys.prefix}s:*")

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisQueue:
        return cls(RedisQueueConfig(url=url, **options))

    # -- reads --------------------------------------------------------------------------

    async def get(self, request_id: str) -> RequestRecord | None:
        fields = _hash(await self._redis.hgetall(self._keys.record(request_id)))
        return _record(fields) if fields else None

    async def queued(self) -> tuple[Request, ...]:
        """The queued ids in arrival order, then the requests: a request's fields never
        change once enqueued, so only ids this client has not seen queued before are read
        (in chunks of `snapshot_batch`); the control loop asks every round, and a long
        queue then costs one ZRANGE instead of re-reading and parsing every request."""
        ids = _strs(await self._redis.zrange(self._keys.queued, 0, -1))
        known = self._queued_cache
        missing = [rid for rid in ids if rid not in known]
        fetched: dict[str, Request] = {}
        for chunk in _chunks(missing, self.config.snapshot_batch):
            text = await self._queued_requests(list(map(self._keys.record, chunk)))
            for data in json.loads(cast(str, text)):
                fetched[data["id"]] = Request(**data, state=RequestState.QUEUED)
        # A request pulled between the ZRANGE and its read is left out; one requeued
        # meanwhile shows up in the next snapshot.
        current = {rid: r for rid in ids if (r := known.get(rid) or fetched.get(rid))}
        self._queued_cache = current
        return tuple(current.values())

    async def in_flight(self) -> tuple[RequestRecord, ...]:
        ids = _strs(await self._redis.zrange(self._keys.leases, 0, -1))
        records = await self._records(ids)
        return tuple(r for r in records if r.state in _LIVE)

    async def _records(self, ids: Sequence[str]) -> list[RequestRecord]:
        records: list[RequestRecord] = []
        for chunk in _chunks(ids, _READ_BATCH):
            async with self._redis.pipeline(transaction=False) as pipe:
                for rid in chunk:
                    pipe.hgetall(self._keys.record(rid))
                rows = await pipe.execute()
            records += [_record(fields) for fields in rows if fields]
        return records

    async def counts(self) -> Mapping[RequestState, int]:
        stored = _hash(await self._redis.hgetall(self._keys.counts))
        return {state: int(stored.get(state, 0)) for state in RequestState}

    async def current_plan(self) -> PublishedPlan | None:
        """The plan; its JSON is read and parsed only when the epoch changed (agents ask
        every round, the plan changes far less often)."""
        cached = self._plan_cache
        if cached is not None and self._watching and cached.epoch == self._plan_epoch:
            return cached  # the watcher saw no newer epoch
        epoch = await self._redis.hget(self._keys.plan, "epoch")
        if epoch is None:
            return None
        if cached is not None and cached.epoch == int(epoch):
            return cached
        epoch, text = _strs(await self._redis.hmget(self._keys.plan, ["epoch", "json"]))
        if epoch is None or text is None:
            return None
        self._plan_cache = PublishedPlan.from_json(text).with_epoch(int(epoch))
        return self._plan_cache

    async def instances(self) -> tuple[InstanceStatus, ...]:
        stored = _hash(await self._redis.hgetall(self._keys.instances))
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
        ]
        args: list[str | int] = [
            request.id,
            _request_json(request),
            -1 if limit is None else limit,
            request.tenant,
            -1 if tenant_limit is None else tenant_limit,
        ]
        outcome = await self._enqueue_batch.call(keys, args)
        if outcome == -1:
            raise DuplicateRequestError(request.id)
        if outcome == -2:
            scope = "queue" if limit == bounds.max_queued else "reserved"
            raise bounds.full_error(request.slo_class, request.tenant, scope)
        if outcome == -3:
            raise bounds.full_error(request.slo_class, request.tenant, "tenant")

    async def pull(
        self, instance_id: str, request_ids: Sequence[str], lease_s: float, now_s: float
    ) -> tuple[Request, ...]:
        if not request_ids:
            return ()
        k = self._keys
        keys = [k.queued, k.leases, k.counts, k.tenants, *map(k.record, request_ids)]
        flat = await self._pull(keys, [instance_id, _num(now_s + lease_s), *request_ids])
        return tuple(
            request_from_dict({**json.loads(flat[i + 1]), "state": RequestState.DISPATCHED})
            for i in range(0, len(flat), 2)
        )

    async def mark_running(self, request_id: str, instance_id: str) -> bool:
        keys = [self._keys.record(request_id), self._keys.counts]
        return bool(await self._mark_running(keys, [instance_id]))

    async def renew_leases(
        self, instance_id: str, request_ids: Sequence[str], lease_s: float, now_s: float
    ) -> None:
        if request_ids:
            keys = [self._keys.leases, *map(self._keys.record, request_ids)]
            await self._renew(keys, [instance_id, _num(now_s + lease_s), *request_ids])

    async def requeue(
        self, instance_id: str, request_ids: Sequence[str], evicted: bool, now_s: float
    ) -> tuple[str, ...]:
        mode_args = ["holder", instance_id, "1" if evicted else "0", _num(now_s)]
        return await self._run_requeue(request_ids, mode_args)

    async def expire_leases(self, now_s: float) -> tuple[str, ...]:
        due = _strs(await self._redis.zrangebyscore(self._keys.leases, "-inf", now_s))
        # The script checks each lease again: one renewed since the read above stays.
        return await self._run_requeue(due, ["lease", "", "0", _num(now_s)])

    async def _run_requeue(self, ids: Sequence[str], args: list[str]) -> tuple[str, ...]:
        if not ids:
            return ()
        k = self._keys
        keys = [k.queued, k.leases, k.counts, k.changes, k.tenants]
        for rid in ids:
            keys += [k.record(rid), k.stream(rid)]
        return tuple(await self._requeue(keys, [*args, *ids]))

    async def complete(self, result: RequestResult) -> bool:
        check_result(result)
        return await self._run_finish(result, "holder")

    async def cancel(self, request_id: str, now_s: float) -> bool:
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
            _sources(result.state),
            json.dumps(result.to_dict(), separators=(",", ":")),
            _num(done_event(result, 0).at_s),
            int(self.config.finished_ttl_s * 1000),
        ]
        return bool(await self._finish(keys, args))

    async def annotate(self, plan: PublishedPlan) -> None:
        targets = {
            rid: group.group_id for group in plan.groups.values() for rid in group.request_ids
        }
        ids = list(targets)
        for chunk in _chunks(ids, self.config.annotate_batch):
            args: list[str] = []
            for rid in chunk:
                wait_s = plan.predicted_wait_s.get(rid)
                args += [targets[rid], "" if wait_s is None else _num(wait_s)]
            await self._annotate([self._keys.record(rid) for rid in chunk], args)

    async def publish_plan(self, plan: PublishedPlan) -> PublishedPlan:
        keys = [self._keys.epoch, self._keys.plan, self._keys.plan_changes]
        epoch = await self._publish_plan(keys, [plan.to_json()])
        return plan.with_epoch(int(epoch))

    async def emit(self, event: StreamEvent) -> None:
        if event.kind is StreamKind.DONE:
            raise QueueError("DONE is emitted by complete() or cancel(), not by emit()")
        await self._emit(*self._emit_call(event))

    async def emit_many(self, events: Sequence[StreamEvent]) -> None:
        if len(events) <= 1:
            for event in events:
                await self.emit(event)
            return
        if any(event.kind is StreamKind.DONE for event in events):
            raise QueueError("DONE is emitted by complete() or cancel(), not by emit()")
        calls = [self._emit_call(event) for event in events]
        for result in await _pipelined(self._redis, self._emit, calls):
            if isinstance(result, Exception):
                raise result

    def _emit_call(self, event: StreamEvent) -> tuple[list[str], list[str | int]]:
        rid = event.request_id
        args: list[str | int] = [
            str(event.kind),
            event.attempt,
            _num(event.at_s),
            event.text,
            event.num_tokens,
            event.offset_tokens,
        ]
        return [self._keys.record(rid), self._keys.stream(rid)], args

    async def report_instance(self, status: InstanceStatus) -> None:
        await self._redis.hset(self._keys.instances, status.instance_id, status.to_json())

    # -- waiting ------------------------------------------------------------------------

    async def stream(
        self, request_id: str, timeout_s: float | None = None
    ) -> AsyncIterator[StreamEvent]:
        """Read with XRANGE from the last entry each time the stream is poked (see
        qlm/queue/redis_pokes.py), and on a timer should a poke be lost."""
        record_key, stream_key = self._keys.record(request_id), self._keys.stream(request_id)
        if not await self._redis.exists(record_key):
            raise UnknownRequestError(request_id)
        await self._pokes.start(timeout_s=1.0)
        start, waited_s = "-", 0.0
        with self._pokes.watch(stream_key) as poke:
            while True:
                poke.clear()
                entries = _range(await self._redis.xrange(stream_key, start, "+", count=256))
                for entry_id, fields in entries:
                    start = f"({entry_id}"
                    event = _event(request_id, fields)
                    yield event
                    if event.kind is StreamKind.DONE:
                        return
                if entries:
                    waited_s = 0.0
                    continue
                block_s = self._block_s(timeout_s, waited_s)
                if not self._pokes.subscribed:
                    block_s = min(block_s, _UNSUBSCRIBED_POLL_S)
                if await _wait_event(poke, block_s):
                    continue
                waited_s += block_s
                if timeout_s is not None and waited_s >= timeout_s:
                    raise TimeoutError(f"no stream event for {request_id!r} within {timeout_s} s")
                if not await self._redis.exists(record_key):
                    raise UnknownRequestError(request_id)  # expired while we waited

    def _block_s(self, timeout_s: float | None, waited_s: float) -> float:
        chunk_s = self.config.block_chunk_s
        return chunk_s if timeout_s is None else min(chunk_s, max(timeout_s - waited_s, 0.0))

    async def wait_for_change(self, timeout_s: float) -> bool:
        streams: dict[KeyT, StreamIdT] = {self._keys.changes: self._last_change}
        block = _ms(timeout_s) if timeout_s > 0 else None  # None: do not block
        reply = _entries(await self._blocking.xread(streams, count=1, block=block))
        if not reply:
            return False
        newest = cast(_Entries, await self._redis.xrevrange(self._keys.changes, count=1))
        self._last_change = (newest or reply)[-1][0]
        return True

    async def wait_for_plan(self, newer_than_epoch: int, timeout_s: float) -> bool:
        """Served by one watcher task per queue that blocks on the plan-change stream, so
        any number of waiters (and their cancellation) cost no Redis connection."""
        if self._plan_watcher is None or self._plan_watcher.done():
            self._plan_watcher = asyncio.create_task(self._watch_plans(), name="qlm-plan-watch")
        deadline_s = time.monotonic() + timeout_s
        while self._plan_epoch <= max(newer_than_epoch, 0):  # 0: no plan seen yet
            self._plan_signal.clear()
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left_s):
                    await self._plan_signal.wait()
        return True

    @property
    def _watching(self) -> bool:
        """The watcher runs and heard from Redis within a blocking read's length (a
        half-open connection would otherwise freeze its epoch, and agents on the cache)."""
        fresh_s = self.config.block_chunk_s + 1.0
        return (
            self._plan_watcher is not None
            and not self._plan_watcher.done()
            and time.monotonic() - self._plan_heard_at_s < fresh_s
        )

    async def _watch_plans(self) -> None:
        last_id = "0-0"
        block_ms = _ms(self.config.block_chunk_s)
        while True:
            try:
                streams: dict[KeyT, StreamIdT] = {self._keys.plan_changes: last_id}
                reply = _entries(await self._blocking.xread(streams, count=16, block=block_ms))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: readers ask Redis until it is back
                if not isinstance(exc, RedisConnectionError | RedisTimeoutError):
                    log.warning("plan watcher: %r; retrying", exc)
                self._plan_epoch = 0
                await asyncio.sleep(0.1)
                continue
            self._plan_heard_at_s = time.monotonic()
            for entry_id, fields in reply:
                last_id = entry_id
                self._plan_epoch = max(self._plan_epoch, int(fields["e"]))
            if reply:
                self._plan_signal.set()

    async def try_lead(self, node_id: str, lease_s: float) -> bool:
        lease_ms = max(1, int(lease_s * 1000))
        if await self._redis.set(self._keys.leader, node_id, nx=True, px=lease_ms):
            return True
        return bool(await self._renew_lead([self._keys.leader], [node_id, lease_ms]))

    async def close(self) -> None:
        await self._pokes.close()
        if self._plan_watcher is not None:
            self._plan_watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._plan_watcher
            self._plan_watcher = None
        if self._owns_client:
            await self._redis.aclose()
            await self._blocking.aclose()


async def _pipelined(
    client: redis.Redis,
    script: AsyncScript,
    calls: Sequence[tuple[list[str], list[str | int]]],
) -> list[Any]:
    """Each call's result (or error) from one pipeline of EVALSHAs. Not redis-py's Script
    in a pipeline, which asks SCRIPT EXISTS first (a second round trip per pipeline); a
    server that lost the script (restart, SCRIPT FLUSH) gets it loaded by the calls that
    then run again, in order."""
    async with client.pipeline(transaction=False) as pipe:
        for keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        results: list[Any] = await pipe.execute(raise_on_error=False)
    if any(isinstance(r, NoScriptError) for r in results):
        results = []
        for keys, args in calls:  # Script.__call__ loads the script on NOSCRIPT
            try:
                results.append(await script(keys, args))
            except Exception as exc:
                results.append(exc)
    return results


class _GroupCommit:
    """Script calls made in the same event-loop iteration go to Redis in one pipeline: one
    write and one read for all of them instead of one round trip each. Under load the API
    parses several requests per iteration, and on a small machine the system calls of a
    round trip cost more than the script. Each call still gets its own result or error."""

    def __init__(self, client: redis.Redis, script: AsyncScript) -> None:
        self._client = client
        self._script = script
        self._pending: list[tuple[list[str], list[str | int], asyncio.Future[Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def call(self, keys: list[str], args: list[str | int]) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((keys, args, future))
        if len(self._pending) == 1:
            loop.call_soon(self._start_flush)
        return await future

    def _start_flush(self) -> None:
        task = asyncio.get_running_loop().create_task(self._flush(self._pending))
        self._pending = []
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(
        self, batch: list[tuple[list[str], list[str | int], asyncio.Future[Any]]]
    ) -> None:
        try:
            if len(batch) == 1:
                keys, args, _ = batch[0]
                results: list[Any] = [await self._script(keys, args)]
            else:
                calls = [(keys, args) for keys, args, _ in batch]
                results = await _pipelined(self._client, self._script, calls)
        except Exception as exc:  # the connection failed: every call in the batch fails
            results = [exc] * len(batch)
        for (_, _, future), result in zip(batch, results, strict=True):
            if future.done():
                continue  # the caller was cancelled
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)


_Entries = list[tuple[str, dict[str, str]]]
_UNSUBSCRIBED_POLL_S = 0.05  # stream re-read period while the poke subscription is down


async def _wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()


def _range(reply: object) -> _Entries:
    """XRANGE's reply: [(id, fields), ...]."""
    return cast(_Entries, reply)


def _strs(value: object) -> list[str]:
    """A list reply, as decode_responses=True gives it."""
    return cast(list[str], value)


def _hash(value: object) -> dict[str, str]:
    return cast(dict[str, str], value)


def _entries(reply: object) -> _Entries:
    """The entries of XREAD's reply for one stream ([[name, entries]] in RESP2)."""
    return cast(_Entries, cast(list[Any], reply)[0][1]) if reply else []


def _ms(seconds: float) -> int:
    """A block time for XREAD: at least 1 ms (0 would block forever)."""
    return max(1, round(seconds * 1000))
