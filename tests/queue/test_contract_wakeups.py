"""Contract additions for the live plane's latency path, run against every implementation:
batched stream writes, waiting for a newer plan, and stream readers woken by the writer
(not by their re-read timer)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from qlm.control.plan import PlannedGroup, PublishedPlan
from qlm.queue.queue_protocol import DuplicateRequestError, GlobalQueue
from qlm.queue.records import StreamEvent, StreamKind
from tests.factories import make_request
from tests.queue import test_contract as contract
from tests.queue.test_contract import QueueMaker, collect, enqueue_n, result

make = contract.make  # the contract suite's fixtures: every implementation
queue = contract.queue


def interleaved(request_ids: tuple[str, ...], count: int) -> list[StreamEvent]:
    """`count` one-token chunks per request, the requests' chunks taking turns; texts
    `<id>-<offset>`."""
    return [
        StreamEvent(rid, StreamKind.TOKENS, 1, float(i), f"{rid}-{i}", 1, i)
        for i in range(count)
        for rid in request_ids
    ]


def _plan() -> PublishedPlan:
    group = PlannedGroup("g", "m7b", "interactive", ("r0",))
    return PublishedPlan(0, 0.0, {"i0": ("g",)}, {"g": group})


async def test_emit_many_keeps_each_streams_order(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 2)
    await queue.pull("i0", ["r0", "r1"], lease_s=5.0, now_s=0.0)
    events = interleaved(("r0", "r1"), 4)
    await queue.emit_many(events)
    await queue.complete(result("r0", "i0"))
    await queue.emit_many([StreamEvent("r0", StreamKind.TOKENS, 1, 9.0, "late", 1, 4)])
    await queue.complete(result("r1", "i0"))
    for rid in ("r0", "r1"):
        got = await collect(queue, rid)
        assert [e.text for e in got[:-1]] == [f"{rid}-{i}" for i in range(4)]  # "late" dropped
        assert got[-1].kind is StreamKind.DONE


async def test_wait_for_plan_returns_at_once_for_an_existing_newer_plan(
    queue: GlobalQueue,
) -> None:
    assert not await queue.wait_for_plan(0, timeout_s=0.05)  # none published
    assert not await queue.wait_for_plan(-1, timeout_s=0.05)  # an agent that holds none
    published = await queue.publish_plan(_plan())
    assert await queue.wait_for_plan(published.epoch - 1, timeout_s=0.0)
    assert not await queue.wait_for_plan(published.epoch, timeout_s=0.05)


async def test_wait_for_plan_wakes_on_a_publish_by_another_client(make: QueueMaker) -> None:
    agent, controller = await make(), await make(block_chunk_s=30.0)
    first = await controller.publish_plan(_plan())
    assert await agent.wait_for_plan(0, timeout_s=5.0)
    waiter = asyncio.create_task(agent.wait_for_plan(first.epoch, timeout_s=20.0))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    started = time.monotonic()
    await controller.publish_plan(_plan())
    assert await asyncio.wait_for(waiter, 5.0)
    assert time.monotonic() - started < 2.0  # woken by the publish, not the timeout
    plan = await agent.current_plan()
    assert plan is not None
    assert plan.epoch == first.epoch + 1


async def test_stream_reader_is_woken_by_the_writer(make: QueueMaker) -> None:
    """Redis readers re-read on a timer only as a fallback (block_chunk_s, 30 s here): a
    chunk must reach them at once through the writer's wake-up."""
    writer, reader = await make(), await make(block_chunk_s=30.0)
    await enqueue_n(writer, 1)
    await writer.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    seen: list[float] = []

    async def read() -> None:
        async for event in reader.stream("r0", timeout_s=60.0):
            seen.append(time.monotonic())
            if event.kind is StreamKind.DONE:
                return

    task = asyncio.create_task(read())
    await asyncio.sleep(0.3)  # the reader is waiting now
    sent = time.monotonic()
    await writer.emit(StreamEvent("r0", StreamKind.TOKENS, 1, 1.0, "a", 1, 0))
    await writer.complete(result("r0", "i0"))
    await asyncio.wait_for(task, 10.0)
    assert len(seen) == 2
    assert seen[0] - sent < 2.0


async def test_sampling_settings_survive_the_store(queue: GlobalQueue) -> None:
    request = replace(make_request(id="s0"), sampling={"temperature": 0.5, "stop": ["\n"]})
    await queue.enqueue(request)
    stored = await queue.get("s0")
    assert stored is not None
    assert stored.request.sampling == {"temperature": 0.5, "stop": ["\n"]}
    (queued,) = await queue.queued()
    assert queued.sampling == request.sampling
    (pulled,) = await queue.pull("i0", ["s0"], lease_s=5.0, now_s=0.0)
    assert pulled.sampling == request.sampling


async def test_concurrent_enqueues_each_get_their_own_outcome(queue: GlobalQueue) -> None:
    """Redis sends enqueues made together in one pipeline: a refused one must not affect
    the others, and each caller sees its own result."""
    await queue.enqueue(make_request(id="dup"))
    ids = [f"c{i}" for i in range(40)]
    outcomes = await asyncio.gather(
        *(queue.enqueue(make_request(id=rid)) for rid in [*ids[:20], "dup", *ids[20:]]),
        return_exceptions=True,
    )
    assert isinstance(outcomes[20], DuplicateRequestError)
    assert [o for i, o in enumerate(outcomes) if i != 20] == [None] * 40
    queued_ids = {r.id for r in await queue.queued()}
    assert queued_ids == {"dup", *ids}


async def test_stream_batches_hold_what_was_there_together(make: QueueMaker) -> None:
    """Events written together come as one batch; a batch ends at DONE (nothing written
    after it is read); the batches flattened are `stream`'s events."""
    producer, reader = await make(), await make()
    await enqueue_n(producer, 1)
    await producer.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    first = [StreamEvent("r0", StreamKind.TOKENS, 1, float(i), f"a{i}", 1, i) for i in range(3)]
    await producer.emit_many(first)
    batches = reader.stream_batches("r0", timeout_s=5.0)
    assert list(await anext(batches)) == first  # all three were there at the first read
    waiting = asyncio.create_task(anext(batches))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # nothing new: the reader waits
    second = [StreamEvent("r0", StreamKind.TOKENS, 1, 5.0 + i, f"b{i}", 1, 3 + i) for i in (0, 1)]
    await producer.emit_many(second)
    assert list(await asyncio.wait_for(waiting, 5.0)) == second
    await producer.emit(StreamEvent("r0", StreamKind.TOKENS, 1, 8.0, "c", 1, 5))
    await producer.complete(result("r0", "i0"))
    last = list(await asyncio.wait_for(anext(batches), 5.0))
    assert [e.text for e in last[:-1]] == ["c"]
    assert last[-1].kind is StreamKind.DONE
    assert await anext(batches, None) is None  # ended after DONE
    flat = [e for batch in [first, second, last] for e in batch]
    assert await collect(reader, "r0") == flat


async def test_changes_made_while_nobody_waited_wake_once(make: QueueMaker) -> None:
    loop_queue, api_queue = await make(), await make()
    await loop_queue.wait_for_change(0.0)  # forget what came before
    for i in range(5):
        await api_queue.enqueue(make_request(id=f"c{i}"))
    assert await loop_queue.wait_for_change(1.0)  # one round takes all five
    assert not await loop_queue.wait_for_change(0.05)


async def test_one_write_of_live_and_finished_streams_appends_only_the_live(
    queue: GlobalQueue,
) -> None:
    """A round's events for a finished request and a live one, interleaved, more than one
    Redis EMIT call holds: the live stream gets all of its own in order, the finished none."""
    await enqueue_n(queue, 2)
    await queue.pull("i0", ["r0", "r1"], lease_s=5.0, now_s=0.0)
    await queue.complete(result("r0", "i0"))
    events = interleaved(("r0", "r1"), 200)
    await queue.emit_many(events)
    await queue.complete(result("r1", "i0"))
    assert [e.kind for e in await collect(queue, "r0")] == [StreamKind.DONE]
    live = await collect(queue, "r1")
    assert [e.text for e in live[:-1]] == [f"r1-{i}" for i in range(200)]
    assert live[-1].kind is StreamKind.DONE
