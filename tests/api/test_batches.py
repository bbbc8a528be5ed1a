"""OpenAI's Files and Batch APIs through the official client, in process: a fake agent serves
the lines, the batch runner is stepped by the test (tests/serve/test_batch_plane.py runs it
live, on Redis, across a restart)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from qlm.api.batch_runner import BatchRunner
from qlm.batch.job_store import BatchStore
from qlm.clock import VirtualClock
from qlm.queue.memory import MemoryQueue
from tests.api.fake_agent import FakeAgent

Line = dict[str, Any]


def chat_line(custom_id: str, text: str, model: str = "m7b") -> Line:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(lines: list[Line | str]) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[openai.AsyncOpenAI]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        yield openai.AsyncOpenAI(base_url="http://api/v1", api_key="unused", http_client=http)


async def run_jobs(app: FastAPI, rounds: int = 200) -> None:
    """Step the runner until no job is left unfinished (the fake agent serves meanwhile)."""
    runner: BatchRunner = app.state.batch_runner
    store: BatchStore = app.state.batch_store
    for _ in range(rounds):
        active = await store.active()
        if not active:
            return
        for job in active:
            await runner.advance(job)
        await asyncio.sleep(0.01)
    raise AssertionError(f"jobs still unfinished: {[j.status for j in await store.active()]}")


async def test_a_batch_round_trip_reports_bad_lines_by_number(
    app: FastAPI, client: openai.AsyncOpenAI, agent: FakeAgent, queue: MemoryQueue
) -> None:
    lines: list[Line | str] = [
        chat_line("a", "first question"),
        "{not json",
        chat_line("b", "second question"),
        chat_line("c", "unknown model", model="gpt-none"),
        {**chat_line("d", "other endpoint"), "url": "/v1/completions"},
        chat_line("a", "a repeated custom_id"),
        chat_line("e", "third question"),
    ]
    uploaded = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    assert (uploaded.purpose, uploaded.bytes) == ("batch", len(jsonl(lines)))
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "validating"
    await run_jobs(app)
    done = await client.batches.retrieve(batch.id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (7, 3)
    assert done.request_counts.failed == 4
    assert done.errors is not None
    assert done.errors.data is not None
    assert [(e.line, e.code) for e in done.errors.data] == [
        (2, "invalid_json"),
        (4, "model_not_found"),
        (5, "invalid_url"),
        (6, "duplicate_custom_id"),
    ]
    assert done.output_file_id is not None
    assert done.error_file_id is not None
    output = [
        json.loads(x)
        for x in (await client.files.content(done.output_file_id)).text.split("\n")
        if x
    ]
    assert [o["custom_id"] for o in output] == ["a", "b", "e"]
    for o in output:
        body = o["response"]["body"]
        assert o["response"]["status_code"] == 200
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] == "w0 w1 w2 w3 "
        assert body["usage"]["completion_tokens"] == 4
    errors = [
        json.loads(x)
        for x in (await client.files.content(done.error_file_id)).text.split("\n")
        if x
    ]
    assert [e["error"]["line"] for e in errors] == [2, 4, 5, 6]
    # each good line ran once, in the job's class, due by its deadline
    records = [await queue.get(f"{batch.id}-{n}") for n in (1, 3, 7)]
    assert all(r is not None and r.request.slo_class == "batch-2" for r in records)
    assert all(
        r is not None and r.request.completion_deadline_at_s == done.expires_at for r in records
    )
    assert agent.served == 3


async def test_input_that_is_not_jsonl_fails_the_job_whole(
    app: FastAPI, client: openai.AsyncOpenAI
) -> None:
    uploaded = await client.files.create(file=("x.csv", b"a,b\n1,2\n"), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    await run_jobs(app)
    failed = await client.batches.retrieve(batch.id)
    assert failed.status == "failed"
    assert failed.errors is not None
    assert failed.errors.data is not None
    assert failed.errors.data[0].code == "invalid_file"


async def test_cancel_keeps_what_finished_and_reports_the_rest(
    app: FastAPI, client: openai.AsyncOpenAI, agent: FakeAgent
) -> None:
    agent.serving = False
    lines: list[Line | str] = [chat_line(f"q{k}", f"question {k}") for k in range(4)]
    uploaded = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    await app.state.batch_runner.advance(await app.state.batch_store.batch(batch.id))
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    await run_jobs(app)
    cancelled = await client.batches.retrieve(batch.id)
    assert cancelled.status == "cancelled"
    assert cancelled.cancelled_at is not None
    assert cancelled.error_file_id is not None
    assert cancelled.output_file_id is None
    errors = (await client.files.content(cancelled.error_file_id)).text.splitlines()
    assert {json.loads(e)["error"]["code"] for e in errors} == {"batch_cancelled"}
    with pytest.raises(openai.ConflictError):
        await client.batches.cancel(batch.id)


async def test_the_deadline_expires_a_job_and_a_tighter_one_comes_from_metadata(
    app: FastAPI, client: openai.AsyncOpenAI, agent: FakeAgent, clock: VirtualClock
) -> None:
    agent.serving = False
    uploaded = await client.files.create(
        file=("in.jsonl", jsonl([chat_line("a", "q")])), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"qlm_deadline_s": "60", "qlm_slo_class": "batch-1"},
    )
    assert batch.expires_at == int(clock.now_s() + 60)
    await app.state.batch_runner.advance(await app.state.batch_store.batch(batch.id))
    clock.advance_by(61.0)
    await run_jobs(app)
    expired = await client.batches.retrieve(batch.id)
    assert expired.status == "expired"
    assert expired.request_counts is not None
    assert expired.request_counts.failed == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"endpoint": "/v1/embeddings"}, "endpoint"),
        ({"completion_window": "soon"}, "completion_window"),
        ({"input_file_id": "file-none"}, "input_file_id"),
        ({"metadata": {"qlm_slo_class": "gold"}}, "metadata.qlm_slo_class"),
        ({"metadata": {"qlm_deadline_s": "-1"}}, "metadata.qlm_deadline_s"),
    ],
)
async def test_bad_job_fields_are_named(
    client: openai.AsyncOpenAI, fields: dict[str, Any], param: str
) -> None:
    uploaded = await client.files.create(
        file=("in.jsonl", jsonl([chat_line("a", "q")])), purpose="batch"
    )
    args: dict[str, Any] = {
        "input_file_id": uploaded.id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    } | fields
    with pytest.raises(openai.APIStatusError) as raised:
        await client.batches.create(**args)
    assert raised.value.status_code in (400, 404)
    assert isinstance(raised.value.body, dict)
    assert raised.value.body.get("param") == param


async def test_files_list_retrieve_delete_and_purpose(client: openai.AsyncOpenAI) -> None:
    first = await client.files.create(file=("a.jsonl", b"{}\n"), purpose="batch")
    second = await client.files.create(file=("b.jsonl", b"{}\n"), purpose="batch")
    listed = await client.files.list()
    assert {f.id for f in listed.data} == {first.id, second.id}
    assert (await client.files.retrieve(first.id)).filename == "a.jsonl"
    deleted = await client.files.delete(first.id)
    assert deleted.deleted
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(first.id)
    with pytest.raises(openai.BadRequestError):
        await client.files.create(file=("c.jsonl", b"{}\n"), purpose="fine-tune")


async def test_tenants_see_only_their_own_files_and_jobs(queue: MemoryQueue) -> None:
    from qlm.api import create_app
    from qlm.config.api_settings import ApiKey
    from tests.api.conftest import NOW_S, make_settings

    keys = (ApiKey(key="sk-alpha-0123456789", tenant="alpha"),
            ApiKey(key="sk-beta-9876543210", tenant="beta"))  # fmt: skip
    app = create_app(make_settings(api_keys=keys), queue, VirtualClock(NOW_S))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        alpha, beta = (
            openai.AsyncOpenAI(
                base_url="http://api/v1", api_key=k.key.get_secret_value(), http_client=http
            )
            for k in keys
        )
        uploaded = await alpha.files.create(file=("a.jsonl", jsonl([chat_line("a", "q")])),
                                            purpose="batch")  # fmt: skip
        batch = await alpha.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert [f.id for f in (await beta.files.list()).data] == []
        assert [b.id for b in (await beta.batches.list()).data] == []
        for call in (
            beta.files.retrieve(uploaded.id),
            beta.files.content(uploaded.id),
            beta.files.delete(uploaded.id),
            beta.batches.retrieve(batch.id),
            beta.batches.cancel(batch.id),
        ):
            with pytest.raises(openai.NotFoundError):
                await call
        with pytest.raises(openai.NotFoundError):  # another's file cannot start a job
            await beta.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                completion_window="24h",
            )  # fmt: skip
        assert [b.id for b in (await alpha.batches.list()).data] == [batch.id]
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(base_url="http://api/v1", api_key="sk-wrong-000000000",
                                     http_client=http).files.list()  # fmt: skip


async def test_an_upload_over_the_limit_is_refused(queue: MemoryQueue) -> None:
    from qlm.api import create_app
    from tests.api.conftest import NOW_S, make_settings

    settings = make_settings(batch={"max_file_bytes": 2048})
    app = create_app(settings, queue, VirtualClock(NOW_S))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        client = openai.AsyncOpenAI(base_url="http://api/v1", api_key="x", http_client=http)
        with pytest.raises(openai.APIStatusError) as raised:
            await client.files.create(file=("big.jsonl", b"x" * 4096), purpose="batch")
        assert raised.value.status_code == 413
        assert [f.id for f in (await client.files.list()).data] == []


async def test_a_job_is_planned_by_shared_prefix_before_it_is_queued(
    app: FastAPI, client: openai.AsyncOpenAI, queue: MemoryQueue
) -> None:
    doc_a, doc_b = "alpha " * 200, "beta " * 240  # 1,200 characters each: shared blocks
    lines: list[Line | str] = [
        chat_line("a1", doc_a + "question one?"),
        chat_line("b1", doc_b + "question two?"),
        chat_line("a2", doc_a + "question three?"),
        chat_line("a3", doc_a + "question four?"),
        chat_line("b2", doc_b + "question five?"),
    ]
    uploaded = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    runner: BatchRunner = app.state.batch_runner
    for job in await app.state.batch_store.active():
        await runner.advance(job)  # validating -> in_progress: planned, then queued
    got = [await queue.get(f"{batch.id}-{n}") for n in range(1, 6)]
    requests = [r.request for r in got if r is not None]
    assert len(requests) == 5
    doc = {r.id: "a" if r.id.endswith(("-1", "-3", "-4")) else "b" for r in requests}
    by_order = sorted(requests, key=lambda r: r.job_order or "")
    assert len({r.job_order for r in requests}) == 5
    assert "".join(doc[r.id] for r in by_order) in ("aaabb", "bbaaa")  # by document
    leaders = {r.job_leader for r in requests} - {None}
    assert len(leaders) == 2  # one per document's part; the others start after it
    assert all(r.job_group is not None for r in requests)
