"""Queue bounds, on both implementations (the contract suite's `make` fixture): the overall
bound, places reserved for interactive classes, and a bound per tenant whose counts follow
every move into and out of QUEUED (Redis keeps them in the scripts, atomically)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import pytest
import redis.asyncio as aioredis

from qlm.queue.bounds import QueueBounds
from qlm.queue.queue_protocol import GlobalQueue, QueueFullError
from qlm.queue.records import RequestResult
from qlm.queue.redis import RedisQueue
from qlm.types import Request, RequestState
from tests.factories import make_request
from tests.queue import test_contract
from tests.queue.test_contract import QueueMaker

make = test_contract.make  # the contract suite's fixture: every implementation
S = RequestState


def req(rid: str, tenant: str = "t0", slo_class: str = "interactive") -> Request:
    return replace(make_request(id=rid, slo_class=slo_class), tenant=tenant)


async def refused(queue: GlobalQueue, request: Request) -> str:
    """The scope of the QueueFullError enqueue raises."""
    with pytest.raises(QueueFullError) as info:
        await queue.enqueue(request)
    return info.value.scope


async def test_a_tenant_at_its_bound_is_refused_and_others_are_not(make: QueueMaker) -> None:
    queue = await make(max_queued_per_tenant=2)
    await queue.enqueue(req("a1", "a"))
    await queue.enqueue(req("a2", "a"))
    assert await refused(queue, req("a3", "a")) == "tenant"
    await queue.enqueue(req("b1", "b"))  # another tenant has its own bound
    assert [r.id for r in await queue.queued()] == ["a1", "a2", "b1"]
    # A pull frees a place; so does a cancel; a requeue is never refused (even above the bound).
    assert len(await queue.pull("i0", ["a1"], 10.0, 0.0)) == 1
    await queue.enqueue(req("a3", "a"))
    assert await refused(queue, req("a4", "a")) == "tenant"
    assert await queue.requeue("i0", ["a1"], True, 1.0) == ("a1",)
    assert {r.id for r in await queue.queued() if r.tenant == "a"} == {"a1", "a2", "a3"}
    assert await queue.cancel("a2", 2.0)
    assert await refused(queue, req("a4", "a")) == "tenant"  # still 2 queued: a1, a3
    assert await queue.cancel("a3", 2.0)
    await queue.enqueue(req("a4", "a"))


async def test_places_are_reserved_for_interactive_classes(make: QueueMaker) -> None:
    queue = await make(max_queued=4, reserved_queued=2, reserved_classes=frozenset({"interactive"}))
    await queue.enqueue(req("b1", slo_class="batch-2"))
    await queue.enqueue(req("b2", slo_class="batch-1"))
    assert await refused(queue, req("b3", slo_class="batch-2")) == "reserved"
    await queue.enqueue(req("i1"))
    await queue.enqueue(req("i2"))
    assert await refused(queue, req("i3")) == "queue"
    assert await refused(queue, req("b3", slo_class="batch-2")) == "reserved"
    assert len(await queue.pull("i0", ["b1", "i1", "i2"], 10.0, 0.0)) == 3
    await queue.enqueue(req("b3", slo_class="batch-2"))  # 1 queued: below 4 - 2
    counts = await queue.counts()
    assert (counts[S.QUEUED], counts[S.DISPATCHED]) == (2, 3)


async def test_every_way_out_of_the_queue_frees_the_tenant_place(make: QueueMaker) -> None:
    """Pull, complete (a FAILED straight from QUEUED), cancel and lease expiry each move the
    tenant's count; after all of them the tenant is admitted up to its bound again."""
    queue = await make(max_queued_per_tenant=1)
    await queue.enqueue(req("x1", "x"))
    await queue.pull("i0", ["x1"], 1.0, 0.0)
    await queue.enqueue(req("x2", "x"))
    assert await queue.expire_leases(5.0) == ("x1",)  # x1 is back: x holds 2 > 1
    assert await refused(queue, req("x3", "x")) == "tenant"
    assert await queue.complete(RequestResult("x1", S.FAILED, None, finished_at_s=6.0))
    assert await refused(queue, req("x3", "x")) == "tenant"
    assert await queue.cancel("x2", 6.0)
    await queue.enqueue(req("x3", "x"))


@dataclass
class TenantModel:
    """The simplest statement of the bounds: counts recomputed from every request's state."""

    bounds: QueueBounds
    state: dict[str, S] = field(default_factory=dict)
    requests: dict[str, Request] = field(default_factory=dict)

    def queued(self, tenant: str | None = None) -> int:
        return sum(
            s is S.QUEUED and (tenant is None or self.requests[r].tenant == tenant)
            for r, s in self.state.items()
        )

    def refusal(self, request: Request) -> str | None:
        """Which bound refuses `request` (the overall one is checked first), or None."""
        bounds = self.bounds
        if bounds.max_queued is not None:
            reserved = request.slo_class in bounds.reserved_classes
            if self.queued() >= bounds.max_queued:
                return "queue" if reserved or not bounds.reserved_queued else "reserved"
            if not reserved and self.queued() >= bounds.max_queued - bounds.reserved_queued:
                return "reserved"
        tenant_limit = bounds.max_queued_per_tenant
        if tenant_limit is not None and self.queued(request.tenant) >= tenant_limit:
            return "tenant"
        return None


async def walk_step(
    queue: GlobalQueue, model: TenantModel, rng: random.Random, n: int
) -> str | None:
    """One random operation checked against the model; the scope of a refusal, if any."""
    ids = [rid for rid, s in model.state.items() if not s.is_terminal]
    op = rng.choice(["enqueue", "enqueue", "pull", "requeue", "cancel", "complete"])
    if op == "enqueue" or not ids:
        request = req(f"r{n}", rng.choice("abc"), rng.choice(["interactive", "batch-2"]))
        scope = model.refusal(request)
        if scope is None:
            await queue.enqueue(request)
            model.state[request.id], model.requests[request.id] = S.QUEUED, request
        else:
            assert await refused(queue, request) == scope
        return scope
    rid = rng.choice(ids)
    live = model.state[rid]
    if op == "pull" and live is S.QUEUED:
        assert len(await queue.pull("i0", [rid], 10.0, 0.0)) == 1
        model.state[rid] = S.DISPATCHED
    elif op == "requeue" and live is S.DISPATCHED:
        assert await queue.requeue("i0", [rid], False, 0.0) == (rid,)
        model.state[rid] = S.QUEUED
    elif op == "cancel":
        assert await queue.cancel(rid, 0.0)
        model.state[rid] = S.CANCELLED
    elif op == "complete" and live is S.DISPATCHED:
        assert await queue.complete(RequestResult(rid, S.COMPLETED, "i0", finished_at_s=1.0))
        model.state[rid] = S.COMPLETED
    return None


@pytest.mark.parametrize("seed", range(3))
async def test_random_walk_keeps_the_bounds_exact(make: QueueMaker, seed: int) -> None:
    bounds = QueueBounds(
        max_queued=6,
        max_queued_per_tenant=3,
        reserved_queued=2,
        reserved_classes=frozenset({"interactive"}),
    )
    queue = await make(
        max_queued=6,
        max_queued_per_tenant=3,
        reserved_queued=2,
        reserved_classes=frozenset({"interactive"}),
    )
    model = TenantModel(bounds)
    rng = random.Random(seed)
    scopes = [await walk_step(queue, model, rng, n) for n in range(200)]
    assert {"queue", "reserved", "tenant"} <= set(scopes)  # every bound was reached
    queued = await queue.queued()
    assert sorted(r.id for r in queued) == sorted(
        r for r, s in model.state.items() if s is S.QUEUED
    )


@pytest.mark.redis
async def test_redis_keeps_no_count_for_idle_tenants(redis_url: str, redis_key_prefix: str) -> None:
    queue = RedisQueue.from_url(redis_url, key_prefix=redis_key_prefix, max_queued_per_tenant=5)
    for i, tenant in enumerate("aab"):
        await queue.enqueue(req(f"r{i}", tenant))
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    key = f"{redis_key_prefix}tenants"
    assert await client.hgetall(key) == {"a": "2", "b": "1"}
    await queue.pull("i0", ["r0", "r2"], 10.0, 0.0)
    await queue.cancel("r1", 0.0)
    assert await client.hgetall(key) == {}
    await client.aclose()
    await queue.close()


def test_inconsistent_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="exceeds max_queued"):
        QueueBounds(max_queued=2, reserved_queued=3)
    with pytest.raises(ValueError, match="needs max_queued"):
        QueueBounds(reserved_queued=1)
    with pytest.raises(ValueError, match="max_queued_per_tenant"):
        QueueBounds(max_queued_per_tenant=-1)
    assert QueueBounds(max_queued=10, reserved_queued=3).class_limit("batch-2") == 7
    assert QueueBounds(max_queued=10, reserved_queued=3).class_limit("interactive") == 10
