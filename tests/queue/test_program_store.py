"""The program store's contract, on the embedded store and on a real redis-server: what is put
comes back whole, tenants list only their own, `active` holds only running programs (oldest
first), and cancel flags stay apart from the programs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from qlm.config.redis_config import RedisQueueConfig
from qlm.programs.deadlines import CallDeadline
from qlm.programs.graph import ProgramCall
from qlm.programs.program_contexts import ProgramContext
from qlm.programs.state import Program, ProgramStatus
from qlm.programs.storage import MemoryProgramStore, ProgramStore
from qlm.queue.redis.program_store import RedisProgramStore


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[ProgramStore]:
    if request.param == "memory":
        made: ProgramStore = MemoryProgramStore()
    else:
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_key_prefix")
        made = RedisProgramStore.for_queue(RedisQueueConfig(url=url, key_prefix=prefix))
    yield made
    await made.close()


def program(pid: str, tenant: str, at_s: float) -> Program:
    calls = (
        ProgramCall("a", "m7b", "x {{doc}}", 8, {"temperature": 0.5}),
        ProgramCall("b", "m7b", "y {{a}}", 4),
    )
    return Program(
        pid, tenant, at_s, "batch-1", 30.0, calls, {"doc": "text"},
        deadlines={"a": CallDeadline(5.0, 10.0), "b": CallDeadline(20.0, 30.0)},
    )  # fmt: skip


async def test_what_is_put_comes_back_and_lists_follow_tenant_and_status(
    store: ProgramStore,
) -> None:
    first = program("p1", "t1", 1.0)
    done = replace(
        first, status=ProgramStatus.COMPLETED, queued=("a", "b"), outputs={"a": "A", "b": "B"},
        finished_at_s=9.0,
    )  # fmt: skip
    await store.put(first)
    assert await store.get("p1") == first
    await store.put(program("p2", "t1", 2.0))
    await store.put(program("p3", "t2", 3.0))
    assert [p.id for p in await store.active()] == ["p1", "p2", "p3"]
    await store.put(done)
    assert await store.get("p1") == done
    assert [p.id for p in await store.active()] == ["p2", "p3"]
    assert [p.id for p in await store.of_tenant("t1")] == ["p2", "p1"]
    assert await store.get("nope") is None
    assert not await store.cancel_requested("p2")
    await store.request_cancel("p2")
    assert await store.cancel_requested("p2")
    assert await store.get("p2") == program("p2", "t1", 2.0)


async def test_contexts_are_kept_per_program_and_dropped_by_name_or_all(
    store: ProgramStore,
) -> None:
    doc = ProgramContext("doc", "m7b", "text", None, 1.0, "p1.ctx.doc.fill")
    fork = ProgramContext("copy", "m7b", "text", "doc", 2.0, None)
    await store.put_context("p1", doc)
    await store.put_context("p1", fork)
    await store.put_context("p2", doc)
    assert await store.contexts("p1") == {"doc": doc, "copy": fork}
    assert await store.drop_contexts("p1", ["copy", "nope"]) == 1
    assert await store.contexts("p1") == {"doc": doc}
    assert await store.drop_contexts("p1") == 1
    assert await store.contexts("p1") == {}
    assert await store.drop_contexts("p1") == 0
    assert await store.drop_contexts("p2", []) == 0
    assert await store.contexts("p2") == {"doc": doc}
