"""The GlobalQueue contract: one suite, run against every implementation (memory, Redis)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qlm.clock import VirtualClock
from qlm.control.plan import PlanForecast, PlannedGroup, PublishedPlan
from qlm.queue.factory import make_queue
from qlm.queue.memory import MemoryQueue, MemoryQueueConfig
from qlm.queue.queue_protocol import (
    DuplicateRequestError,
    GlobalQueue,
    QueueError,
    QueueFullError,
    UnknownRequestError,
)
from qlm.queue.records import InstanceStatus, RequestRecord, RequestResult, StreamEvent, StreamKind
from qlm.types import PrefixBlock, Request, RequestState
from tests.factories import make_request

QueueMaker = Callable[..., Awaitable[GlobalQueue]]
IMPLS = [
    pytest.param("memory", id="memory"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
]
S = RequestState


@pytest.fixture(params=IMPLS)
async def make(request: pytest.FixtureRequest) -> AsyncIterator[QueueMaker]:
    """Builds queues of the implementation under test; all share one backing store per test
    (two Redis queues built here are two clients of the same data)."""
    made: list[GlobalQueue] = []
    url = "memory://"
    prefix = ""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_key_prefix")

    async def build(**options: Any) -> GlobalQueue:
        if url.startswith("redis"):
            options.setdefault("key_prefix", prefix)
        elif made:
            return made[0]  # one in-memory store: every handle is the same queue
        queue = make_queue(url, **options)
        made.append(queue)
        return queue

    yield build
    for queue in made:
        await queue.close()


@pytest.fixture
async def queue(make: QueueMaker) -> GlobalQueue:
    return await make()


async def enqueue_n(queue: GlobalQueue, n: int, prefix: str = "r") -> list[Request]:
    requests = [make_request(id=f"{prefix}{i}", arrival_at_s=float(i)) for i in range(n)]
    for r in requests:
        await queue.enqueue(r)
    return requests


def result(rid: str, instance: str | None, state: S = S.COMPLETED, **kw: Any) -> RequestResult:
    return RequestResult(rid, state, instance, finished_at_s=kw.pop("finished_at_s", 9.0), **kw)


async def rec(queue: GlobalQueue, rid: str) -> RequestRecord:
    record = await queue.get(rid)
    assert record is not None, f"{rid} is gone"
    return record


async def collect(queue: GlobalQueue, rid: str, timeout_s: float = 2.0) -> list[StreamEvent]:
    return [event async for event in queue.stream(rid, timeout_s=timeout_s)]


# -- enqueue, get, queued ------------------------------------------------------------------


async def test_enqueue_get_and_arrival_order(queue: GlobalQueue) -> None:
    requests = await enqueue_n(queue, 5)
    assert await queue.queued() == tuple(requests)
    record = await queue.get("r3")
    assert record is not None
    assert record.request == requests[3]
    assert (record.state, record.instance_id, record.dispatches) == (S.QUEUED, None, 0)
    assert await queue.get("nope") is None
    counts = await queue.counts()
    assert counts[S.QUEUED] == 5
    assert set(counts) == set(S)


async def test_get_many_reads_each_id_in_order(queue: GlobalQueue) -> None:
    requests = await enqueue_n(queue, 5)
    await queue.pull("i", ["r1"], lease_s=30.0, now_s=0.0)
    found = await queue.get_many(["r4", "nope", "r1", "r0"])
    assert [None if r is None else r.request.id for r in found] == ["r4", None, "r1", "r0"]
    assert found[0] is not None
    assert found[0].request == requests[4]
    assert [None if r is None else r.state for r in found] == [
        S.QUEUED,
        None,
        S.DISPATCHED,
        S.QUEUED,
    ]
    assert await queue.get_many([]) == []


async def test_request_fields_survive_the_store(queue: GlobalQueue) -> None:
    request = Request(
        "odd id/é",
        "llama",
        123,
        45,
        "batch-1",
        arrival_at_s=1712345678.123456,
        ttft_deadline_at_s=1712345738.123456,
        completion_deadline_at_s=1712349999.5,
        tenant="acme",
        prompt='say "hi"\n',
        prefix=(PrefixBlock(2**64 - 1, 100), PrefixBlock(7, 20)),  # keys are 64-bit hashes
    )
    await queue.enqueue(request)
    record = await queue.get(request.id)
    assert record is not None
    assert record.request == request
    assert record.request.prefix == request.prefix
    assert await queue.queued() == (request,)
    assert (await queue.queued())[0].prefix == request.prefix


async def test_duplicate_ids_are_refused(queue: GlobalQueue) -> None:
    await queue.enqueue(make_request(id="a"))
    with pytest.raises(DuplicateRequestError):
        await queue.enqueue(make_request(id="a"))
    await queue.cancel("a", now_s=1.0)
    with pytest.raises(DuplicateRequestError):
        await queue.enqueue(make_request(id="a"))
    assert (await queue.counts())[S.QUEUED] == 0


async def test_only_queued_requests_are_enqueued(queue: GlobalQueue) -> None:
    running = make_request(id="a").transition(S.DISPATCHED)
    with pytest.raises(QueueError):
        await queue.enqueue(running)
    assert await queue.get("a") is None


async def test_max_queued_bounds_the_queue(make: QueueMaker) -> None:
    queue = await make(max_queued=3)
    await enqueue_n(queue, 3)
    with pytest.raises(QueueFullError):
        await queue.enqueue(make_request(id="extra"))
    assert await queue.get("extra") is None
    await queue.pull("i0", ["r0"], lease_s=10.0, now_s=0.0)
    await queue.enqueue(make_request(id="extra"))  # room again
    assert await queue.requeue("i0", ["r0"], evicted=True, now_s=1.0) == ("r0",)
    assert len(await queue.queued()) == 4  # a requeue is never refused


# -- pull, mark_running, leases --------------------------------------------------------------


async def test_pull_moves_only_queued_requests(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 4)
    await queue.cancel("r1", now_s=0.5)
    pulled = await queue.pull("i0", ["r0", "r1", "r2", "missing", "r0"], lease_s=5.0, now_s=1.0)
    assert [r.id for r in pulled] == ["r0", "r2"]
    assert all(r.state is S.DISPATCHED for r in pulled)
    assert await queue.pull("i1", ["r0", "r2", "r3"], lease_s=5.0, now_s=1.0) == (
        (await rec(queue, "r3")).request,
    )
    record = await queue.get("r0")
    assert record is not None
    assert (record.state, record.instance_id, record.lease_expires_at_s) == (
        S.DISPATCHED,
        "i0",
        6.0,
    )
    assert record.dispatches == 1
    assert [r.id for r in await queue.queued()] == []
    in_flight = {r.id: r.instance_id for r in await queue.in_flight()}
    assert in_flight == {"r0": "i0", "r2": "i0", "r3": "i1"}
    counts = await queue.counts()
    assert (counts[S.DISPATCHED], counts[S.CANCELLED], counts[S.QUEUED]) == (3, 1, 0)


async def test_concurrent_pulls_give_each_request_to_exactly_one_instance(
    make: QueueMaker,
) -> None:
    queues = [await make() for _ in range(3)]  # for Redis: three clients of one store
    await enqueue_n(queues[0], 200)
    rng = random.Random(7)
    asks = [
        (f"i{k}", rng.sample([f"r{i}" for i in range(200)], 60), queues[k % len(queues)])
        for k in range(24)
    ]
    results = await asyncio.gather(
        *(q.pull(instance, ids, lease_s=30.0, now_s=1.0) for instance, ids, q in asks)
    )
    owner: dict[str, str] = {}
    for (instance, _, _), pulled in zip(asks, results, strict=True):
        for request in pulled:
            assert request.id not in owner, f"{request.id} pulled twice"
            owner[request.id] = instance
    asked = {rid for _, ids, _ in asks for rid in ids}
    assert set(owner) == asked
    in_flight = {r.id: r.instance_id for r in await queues[0].in_flight()}
    assert in_flight == owner
    assert {r.id for r in await queues[0].queued()} == {f"r{i}" for i in range(200)} - asked


async def test_mark_running_only_by_the_holder(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 2)
    assert not await queue.mark_running("r0", "i0")  # still queued
    await queue.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    assert not await queue.mark_running("r0", "i1")
    assert (await rec(queue, "r0")).state is S.DISPATCHED
    assert await queue.mark_running("r0", "i0")
    assert await queue.mark_running("r0", "i0")  # idempotent for the holder
    assert (await rec(queue, "r0")).state is S.RUNNING
    assert not await queue.mark_running("missing", "i0")
    counts = await queue.counts()
    assert (counts[S.RUNNING], counts[S.DISPATCHED]) == (1, 0)


async def test_renew_leases_only_for_the_holder(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 2)
    await queue.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    await queue.pull("i1", ["r1"], lease_s=5.0, now_s=0.0)
    assert await queue.renew_leases("i0", ["r0", "r1"], lease_s=10.0, now_s=3.0) == ("r1",)
    leases = {r.id: r.lease_expires_at_s for r in await queue.in_flight()}
    assert leases == {"r0": 13.0, "r1": 5.0}


async def test_a_holder_learns_which_leases_it_lost(queue: GlobalQueue) -> None:
    """A lease that ran out (the request is queued again, or another instance took it) and
    a request that ended are lost; the holder keeps the rest."""
    await enqueue_n(queue, 4)
    await queue.pull("i0", ["r0", "r1", "r2", "r3"], lease_s=5.0, now_s=0.0)
    await queue.renew_leases("i0", ["r0", "r2", "r3"], lease_s=5.0, now_s=1.0)
    assert await queue.expire_leases(now_s=5.5) == ("r1",)
    await queue.cancel("r2", now_s=5.5)
    assert await queue.renew_leases("i0", ["r0", "r1", "r2", "r3"], 5.0, now_s=5.6) == ("r1", "r2")
    await queue.pull("i1", ["r1"], lease_s=5.0, now_s=5.7)
    assert await queue.renew_leases("i0", ["r1", "r3"], 5.0, now_s=5.8) == ("r1",)
    assert await queue.renew_leases("i1", ["r1"], 5.0, now_s=5.8) == ()


async def test_expired_leases_go_back_to_the_queue(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 3)
    await queue.pull("i0", ["r0", "r1", "r2"], lease_s=5.0, now_s=0.0)
    await queue.mark_running("r1", "i0")
    await queue.renew_leases("i0", ["r2"], lease_s=5.0, now_s=4.0)
    assert await queue.expire_leases(now_s=4.9) == ()
    assert sorted(await queue.expire_leases(now_s=5.0)) == ["r0", "r1"]
    assert [r.id for r in await queue.queued()] == ["r0", "r1"]
    record = await queue.get("r1")
    assert record is not None
    assert (record.state, record.instance_id, record.lease_expires_at_s) == (S.QUEUED, None, None)
    assert (record.evictions, record.dispatches) == (0, 1)
    assert not await queue.complete(result("r1", "i0"))  # the lease is gone
    assert [r.id for r in await queue.in_flight()] == ["r2"]
    assert await queue.expire_leases(now_s=100.0) == ("r2",)


# -- requeue ---------------------------------------------------------------------------------


async def test_requeue_only_by_the_holder_keeps_arrival_order(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 4)
    await queue.pull("i0", ["r0", "r2"], lease_s=5.0, now_s=0.0)
    await queue.mark_running("r2", "i0")
    assert await queue.requeue("i1", ["r0", "r2"], evicted=True, now_s=1.0) == ()
    assert await queue.requeue("i0", ["r2", "r0", "r1"], evicted=True, now_s=1.0) == ("r2", "r0")
    assert [r.id for r in await queue.queued()] == ["r0", "r1", "r2", "r3"]
    r2 = await queue.get("r2")
    assert r2 is not None
    assert (r2.state, r2.instance_id, r2.evictions, r2.dispatches) == (S.QUEUED, None, 1, 1)
    [again] = await queue.pull_counted("i1", ["r0"], lease_s=5.0, now_s=2.0)
    assert (again.request.id, again.request.state, again.dispatches) == ("r0", S.DISPATCHED, 2)
    assert await queue.requeue("i1", ["r0"], evicted=False, now_s=3.0) == ("r0",)
    r0 = await queue.get("r0")
    assert r0 is not None
    assert (r0.evictions, r0.dispatches) == (1, 2)


async def test_requeue_emits_a_requeued_event(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 1)
    await queue.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    await queue.emit(StreamEvent("r0", StreamKind.TOKENS, 1, 0.5, "ab", 2, 0))
    await queue.requeue("i0", ["r0"], evicted=True, now_s=1.0)
    await queue.pull("i1", ["r0"], lease_s=5.0, now_s=2.0)
    await queue.emit(StreamEvent("r0", StreamKind.TOKENS, 2, 2.5, "abc", 3, 0))
    assert await queue.complete(result("r0", "i1", text="abc", output_tokens=3))
    events = await collect(queue, "r0")
    assert [(e.kind, e.attempt) for e in events] == [
        (StreamKind.TOKENS, 1),
        (StreamKind.REQUEUED, 1),
        (StreamKind.TOKENS, 2),
        (StreamKind.DONE, 2),
    ]
    assert events[1].at_s == 1.0
    assert events[2] == StreamEvent("r0", StreamKind.TOKENS, 2, 2.5, "abc", 3, 0)


# -- complete and cancel -----------------------------------------------------------------------


async def test_complete_exactly_once_and_only_by_the_holder(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 2)
    await queue.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    await queue.mark_running("r0", "i0")
    assert not await queue.complete(result("r0", "i1"))
    done = result("r0", "i0", text="hello", output_tokens=2, first_token_at_s=1.5)
    assert await queue.complete(done)
    assert not await queue.complete(done)
    assert not await queue.complete(result("r0", "i0", S.FAILED, error="late"))
    record = await queue.get("r0")
    assert record is not None
    assert (record.state, record.result, record.instance_id) == (S.COMPLETED, done, None)
    assert not await queue.complete(result("r1", "i0"))  # queued, not held
    assert not await queue.complete(result("missing", "i0"))
    assert await queue.in_flight() == ()
    counts = await queue.counts()
    assert (counts[S.COMPLETED], counts[S.RUNNING], counts[S.QUEUED]) == (1, 0, 1)


async def test_complete_straight_from_dispatched_and_fail_from_queued(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 2)
    await queue.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    assert await queue.complete(result("r0", "i0"))  # first token came with the last
    assert (await rec(queue, "r0")).state is S.COMPLETED
    assert not await queue.complete(result("r1", None))  # QUEUED -> COMPLETED is illegal
    assert await queue.complete(result("r1", None, S.FAILED, error="no instance serves it"))
    record = await queue.get("r1")
    assert record is not None
    assert record.state is S.FAILED
    assert await queue.queued() == ()
    with pytest.raises(ValueError, match="terminal"):
        await queue.complete(result("r1", None, S.RUNNING))


@pytest.mark.parametrize("state", [S.QUEUED, S.DISPATCHED, S.RUNNING])
async def test_cancel_from_each_live_state(queue: GlobalQueue, state: S) -> None:
    await enqueue_n(queue, 1)
    if state is not S.QUEUED:
        await queue.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    if state is S.RUNNING:
        await queue.mark_running("r0", "i0")
    assert (await rec(queue, "r0")).state is state
    assert await queue.cancel("r0", now_s=2.0)
    record = await queue.get("r0")
    assert record is not None
    assert record.state is S.CANCELLED
    assert record.result is not None
    assert (record.result.state, record.result.finished_at_s) == (S.CANCELLED, 2.0)
    assert await queue.queued() == ()
    assert await queue.in_flight() == ()
    assert not await queue.complete(result("r0", "i0"))
    assert await queue.requeue("i0", ["r0"], evicted=True, now_s=3.0) == ()
    assert await queue.expire_leases(now_s=100.0) == ()
    events = await collect(queue, "r0")
    assert [e.kind for e in events] == [StreamKind.DONE]
    assert events[0].result == record.result
    counts = await queue.counts()
    assert counts[S.CANCELLED] == 1
    assert sum(counts[s] for s in S if not s.is_terminal) == 0


@pytest.mark.parametrize("final", [S.COMPLETED, S.FAILED, S.CANCELLED])
async def test_cancel_of_a_terminal_request_changes_nothing(queue: GlobalQueue, final: S) -> None:
    await enqueue_n(queue, 1)
    await queue.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    await queue.mark_running("r0", "i0")
    assert await queue.complete(result("r0", "i0", final))
    assert not await queue.cancel("r0", now_s=3.0)
    assert (await rec(queue, "r0")).state is final
    assert not await queue.cancel("missing", now_s=3.0)


# -- streams ---------------------------------------------------------------------------------


async def test_stream_replays_from_the_start_and_ends_after_done(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 1)
    await queue.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    chunks = [StreamEvent("r0", StreamKind.TOKENS, 1, 1.0 + i, f"t{i}", 1, i) for i in range(5)]
    for chunk in chunks:
        await queue.emit(chunk)
    final = result("r0", "i0", text="t0t1t2t3t4", output_tokens=5)
    assert await queue.complete(final)
    await queue.emit(StreamEvent("r0", StreamKind.TOKENS, 1, 9.5, "late", 1, 5))  # dropped
    events = await collect(queue, "r0")
    assert events[:-1] == chunks
    assert events[-1] == StreamEvent("r0", StreamKind.DONE, 1, 9.0, result=final)
    assert await collect(queue, "r0") == events  # every reader sees everything


async def test_stream_tails_live_events(make: QueueMaker) -> None:
    producer = await make()
    reader = await make()  # for Redis: another client, like another API replica
    await enqueue_n(producer, 1)
    await producer.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    await producer.emit(StreamEvent("r0", StreamKind.TOKENS, 1, 1.0, "a", 1, 0))
    seen: list[StreamEvent] = []
    got_first = asyncio.Event()

    async def read() -> None:
        async for event in reader.stream("r0", timeout_s=5.0):
            seen.append(event)
            got_first.set()

    task = asyncio.create_task(read())
    await asyncio.wait_for(got_first.wait(), 5.0)
    for i in range(1, 4):
        await producer.emit(StreamEvent("r0", StreamKind.TOKENS, 1, 1.0 + i, "b", 1, i))
        await asyncio.sleep(0.01)
    assert not task.done()
    await producer.complete(result("r0", "i0"))
    await asyncio.wait_for(task, 5.0)
    assert [e.offset_tokens for e in seen[:-1]] == [0, 1, 2, 3]
    assert seen[-1].kind is StreamKind.DONE


async def test_stream_times_out_when_nothing_arrives(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 1)
    with pytest.raises(TimeoutError):
        await collect(queue, "r0", timeout_s=0.1)
    with pytest.raises(UnknownRequestError):
        await collect(queue, "missing", timeout_s=0.1)


async def test_emit_done_is_refused(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 1)
    with pytest.raises(QueueError):
        await queue.emit(StreamEvent("r0", StreamKind.DONE, 1, 1.0, result=result("r0", None)))


# -- plans -----------------------------------------------------------------------------------


def plan(
    *groups: tuple[str, tuple[str, ...]], waits: dict[str, float] | None = None
) -> PublishedPlan:
    planned = {g: PlannedGroup(g, "m7b", "interactive", ids) for g, ids in groups}
    return PublishedPlan(
        epoch=0,
        created_at_s=3.5,
        queues={"i0": tuple(planned), "i1": ()},
        groups=planned,
        policy="edf",
        status="ok",
        forecast=PlanForecast(waits or {}),
    )


async def test_plan_epochs_increase_and_the_latest_is_current(make: QueueMaker) -> None:
    queue = await make()
    other = await make()
    assert await queue.current_plan() is None
    first = await queue.publish_plan(plan(("g0", ("r0",))))
    second = await other.publish_plan(plan(("g1", ("r1", "r2")), waits={"r1": 2.5}))
    assert 0 < first.epoch < second.epoch
    current = await queue.current_plan()
    assert current == second
    assert current is not None
    assert current.queue_of("i0")[0].request_ids == ("r1", "r2")
    assert current.forecast.predicted_wait_s == {"r1": 2.5}


async def test_annotate_sets_group_and_predicted_wait_of_queued_requests(
    queue: GlobalQueue,
) -> None:
    await enqueue_n(queue, 3)
    await queue.pull("i0", ["r2"], lease_s=5.0, now_s=0.0)
    await queue.annotate(
        plan(("g0", ("r0", "r2", "missing")), ("g1", ("r1",)), waits={"r0": 1.5, "r2": 3.0})
    )
    r0, r1, r2 = [await rec(queue, f"r{i}") for i in range(3)]
    assert (r0.group_id, r0.predicted_wait_s) == ("g0", 1.5)
    assert (r1.group_id, r1.predicted_wait_s) == ("g1", None)
    assert (r2.group_id, r2.predicted_wait_s) == (None, None)  # already dispatched
    await queue.annotate(plan(("g7", ("r0",)), waits={"r0": 0.25}))
    r0 = await rec(queue, "r0")
    assert (r0.group_id, r0.predicted_wait_s) == ("g7", 0.25)


# -- wait_for_change and leadership -----------------------------------------------------------


async def test_wait_for_change_wakes_on_enqueue(make: QueueMaker) -> None:
    loop_queue = await make()
    api_queue = await make()
    await loop_queue.wait_for_change(0.0)  # forget what came before
    assert not await loop_queue.wait_for_change(0.05)
    waiter = asyncio.create_task(loop_queue.wait_for_change(5.0))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await api_queue.enqueue(make_request(id="a"))
    assert await asyncio.wait_for(waiter, 5.0)
    assert not await loop_queue.wait_for_change(0.05)  # seen already


async def test_wait_for_change_sees_requeue_cancel_and_complete(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 3)
    await queue.wait_for_change(0.0)
    await queue.pull("i0", ["r0", "r1"], lease_s=5.0, now_s=0.0)
    await queue.mark_running("r0", "i0")
    assert not await queue.wait_for_change(0.05)  # pulls are the loop's own doing
    for change in (
        queue.requeue("i0", ["r0"], evicted=True, now_s=1.0),
        queue.cancel("r2", now_s=1.0),
        queue.complete(result("r1", "i0")),
    ):
        await change
        assert await queue.wait_for_change(1.0)


async def test_try_lead_gives_one_leader_and_hands_over_after_expiry(make: QueueMaker) -> None:
    a, b = await make(), await make()
    outcomes = await asyncio.gather(a.try_lead("a", 0.5), b.try_lead("b", 0.5))
    assert sorted(outcomes) == [False, True]
    leader, follower = ("a", "b") if outcomes[0] else ("b", "a")
    queues = {"a": a, "b": b}
    assert await queues[leader].try_lead(leader, 0.5)  # renew
    assert not await queues[follower].try_lead(follower, 0.5)
    await asyncio.sleep(0.7)
    assert await queues[follower].try_lead(follower, 5.0)
    assert not await queues[leader].try_lead(leader, 5.0)


# -- a random walk against a model --------------------------------------------------------------


@dataclass
class Model:
    """What the queue should hold, kept the simplest way."""

    state: dict[str, S] = field(default_factory=dict)
    holder: dict[str, str | None] = field(default_factory=dict)
    lease: dict[str, float] = field(default_factory=dict)
    evictions: dict[str, int] = field(default_factory=dict)
    dispatches: dict[str, int] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def queued(self) -> list[str]:
        return [r for r in self.order if self.state[r] is S.QUEUED]

    def holds(self, rid: str, instance: str) -> bool:
        return self.state.get(rid) in (S.DISPATCHED, S.RUNNING) and self.holder[rid] == instance

    def to_queue(self, rid: str, evicted: bool) -> None:
        self.state[rid], self.holder[rid] = S.QUEUED, None
        self.evictions[rid] += int(evicted)


async def random_step(queue: GlobalQueue, model: Model, rng: random.Random, now_s: float) -> None:
    ids = [f"r{i}" for i in range(12)]
    instance = rng.choice(["i0", "i1", "i2"])
    some = rng.sample(ids, rng.randint(1, 4))
    op = rng.choice(["enqueue", "pull", "run", "renew", "requeue", "expire", "complete", "cancel"])
    if op == "enqueue":
        rid = rng.choice(ids)
        if rid in model.state:
            with pytest.raises(DuplicateRequestError):
                await queue.enqueue(make_request(id=rid, arrival_at_s=now_s))
            return
        await queue.enqueue(make_request(id=rid, arrival_at_s=now_s))
        model.state[rid], model.holder[rid] = S.QUEUED, None
        model.evictions[rid] = model.dispatches[rid] = 0
        model.order.append(rid)
    elif op == "pull":
        lease_s = rng.choice([1.0, 3.0])
        expect = [r for r in dict.fromkeys(some) if model.state.get(r) is S.QUEUED]
        got = await queue.pull_counted(instance, some, lease_s=lease_s, now_s=now_s)
        assert [p.request.id for p in got] == expect
        for rid in expect:
            model.state[rid], model.holder[rid] = S.DISPATCHED, instance
            model.lease[rid] = now_s + lease_s
            model.dispatches[rid] += 1
        # each comes with its dispatch count, this pull included (the agent's attempt)
        assert [p.dispatches for p in got] == [model.dispatches[rid] for rid in expect]
    elif op == "run":
        rid = some[0]
        expect_ok = model.holds(rid, instance)
        assert await queue.mark_running(rid, instance) == expect_ok
        if expect_ok:
            model.state[rid] = S.RUNNING
    elif op == "renew":
        await queue.renew_leases(instance, some, lease_s=2.0, now_s=now_s)
        for rid in some:
            if model.holds(rid, instance):
                model.lease[rid] = now_s + 2.0
    elif op == "requeue":
        evicted = rng.random() < 0.5
        expect = [r for r in dict.fromkeys(some) if model.holds(r, instance)]
        assert list(await queue.requeue(instance, some, evicted, now_s)) == expect
        for rid in expect:
            model.to_queue(rid, evicted)
    elif op == "expire":
        expect = {
            r
            for r, s in model.state.items()
            if s in (S.DISPATCHED, S.RUNNING) and model.lease[r] <= now_s
        }
        assert set(await queue.expire_leases(now_s)) == expect
        for rid in expect:
            model.to_queue(rid, False)
    elif op == "complete":
        rid = some[0]
        holder = model.holder.get(rid) if rng.random() < 0.8 else instance
        final = rng.choice([S.COMPLETED, S.FAILED])
        ok = rid in model.state and model.holds(rid, holder or "-")
        ok = ok or (model.state.get(rid) is S.QUEUED and holder is None and final is S.FAILED)
        assert await queue.complete(result(rid, holder, final)) == ok
        if ok:
            model.state[rid], model.holder[rid] = final, None
    else:
        rid = some[0]
        ok = rid in model.state and not model.state[rid].is_terminal
        assert await queue.cancel(rid, now_s) == ok
        if ok:
            model.state[rid], model.holder[rid] = S.CANCELLED, None


async def check_against(queue: GlobalQueue, model: Model) -> None:
    assert [r.id for r in await queue.queued()] == model.queued()
    in_flight = {r.id: (r.state, r.instance_id) for r in await queue.in_flight()}
    assert in_flight == {
        r: (s, model.holder[r]) for r, s in model.state.items() if s in (S.DISPATCHED, S.RUNNING)
    }
    counts = await queue.counts()
    assert dict(counts) == {s: list(model.state.values()).count(s) for s in S}
    for rid, state in model.state.items():
        record = await queue.get(rid)
        assert record is not None
        assert (record.state, record.evictions, record.dispatches) == (
            state,
            model.evictions[rid],
            model.dispatches[rid],
        )


@pytest.mark.parametrize("seed", range(6))
async def test_random_walk_matches_a_simple_model(make: QueueMaker, seed: int) -> None:
    queue = await make()
    model = Model()
    rng = random.Random(seed)
    now_s = 0.0
    for _ in range(150):
        now_s += rng.choice([0.0, 0.5, 1.0])
        await random_step(queue, model, rng, now_s)
        await check_against(queue, model)


# -- instance status -----------------------------------------------------------------------------


def status(instance_id: str, at_s: float, running: int = 0) -> InstanceStatus:
    return InstanceStatus(
        instance_id, "ready", "m7b", 1.5, running, 100, 1000, at_s, 1, 2, 5000 + running, 1200
    )


async def test_instances_keep_the_latest_report_of_each(make: QueueMaker) -> None:
    agent = await make()
    loop = await make()
    assert await loop.instances() == ()
    await agent.report_instance(status("i1", 1.0))
    await agent.report_instance(status("i0", 1.0))
    await agent.report_instance(status("i1", 2.0, running=3))
    assert await loop.instances() == (status("i0", 1.0), status("i1", 2.0, running=3))


# -- the factory and the memory queue's own options ----------------------------------------------


def test_factory_picks_the_implementation_by_scheme() -> None:
    assert isinstance(make_queue(None), MemoryQueue)
    assert isinstance(make_queue("memory://", key_prefix="ignored:"), MemoryQueue)
    assert make_queue(None, max_queued=5).options.max_queued == 5  # type: ignore[attr-defined]
    with pytest.raises(KeyError, match="known: memory, redis, redis\\+sentinel, rediss, unix"):
        make_queue("kafka://broker")
    with pytest.raises(ValueError, match="no scheme"):
        make_queue("localhost:6379")


async def test_memory_drops_the_oldest_finished_records() -> None:
    queue = MemoryQueue(MemoryQueueConfig(max_finished_records=2))
    await enqueue_n(queue, 4)
    for rid in ("r0", "r1", "r2"):
        assert await queue.cancel(rid, now_s=1.0)
    assert await queue.get("r0") is None
    assert [(await rec(queue, r)).state for r in ("r1", "r2", "r3")] == [
        S.CANCELLED,
        S.CANCELLED,
        S.QUEUED,
    ]
    with pytest.raises(UnknownRequestError):
        await collect(queue, "r0")
    await queue.enqueue(make_request(id="r0"))  # its id is free again
    assert (await queue.counts())[S.CANCELLED] == 3  # terminal counts are totals


async def test_memory_leader_lease_runs_on_the_injected_clock() -> None:
    clock = VirtualClock()
    queue = MemoryQueue(clock=clock)
    assert await queue.try_lead("a", 10.0)
    clock.advance_by(9.9)
    assert not await queue.try_lead("b", 10.0)
    assert await queue.try_lead("a", 10.0)  # renewed until 19.9
    clock.advance_by(9.9)
    assert not await queue.try_lead("b", 10.0)
    clock.advance_by(0.1)
    assert await queue.try_lead("b", 10.0)
    assert not await queue.try_lead("a", 10.0)


@settings(max_examples=40, deadline=None)
@given(rng=st.randoms(use_true_random=False), steps=st.integers(1, 120))
def test_memory_random_walks_found_by_hypothesis(rng: random.Random, steps: int) -> None:
    async def walk() -> None:
        queue, model, now_s = MemoryQueue(), Model(), 0.0
        for _ in range(steps):
            now_s += rng.choice([0.0, 0.5, 1.0])
            await random_step(queue, model, rng, now_s)
            await check_against(queue, model)

    asyncio.run(walk())
