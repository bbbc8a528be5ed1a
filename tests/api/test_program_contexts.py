"""A program's contexts over HTTP (qlm/api/context_routes.py), in process with a fake agent:
a fill queues the context's text, a generation continues it with the text as whole leading
prefix blocks (what the dispatch's prefix locality routes by), a fork shares its parent's
text, contexts end with their program, and bad calls are refused naming the field."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from qlm.api.program_runner import ProgramRunner
from qlm.queue.memory import MemoryQueue
from qlm.types import RequestState
from tests.api.conftest import wait_until
from tests.api.fake_agent import FakeAgent

PROGRAMS = "/v1/qlm/programs"
DOCUMENT = "The quarterly report. " * 60  # 1,320 characters: five whole prefix blocks and more


async def session(client: httpx.AsyncClient) -> str:
    response = await client.post(PROGRAMS, json={"calls": []})
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "running"
    program_id: str = response.json()["id"]
    return program_id


async def fill(client: httpx.AsyncClient, program_id: str, **body: Any) -> httpx.Response:
    return await client.post(f"{PROGRAMS}/{program_id}/contexts", json=body)


async def test_a_generation_continues_its_context_on_the_blocks_the_fill_computed(
    client: httpx.AsyncClient, agent: FakeAgent, queue: MemoryQueue, runner: ProgramRunner
) -> None:
    agent.serving = False
    program_id = await session(client)
    filled = await fill(client, program_id, name="doc", model="m7b", text=DOCUMENT)
    assert filled.status_code == 201, filled.text
    fill_id = filled.json()["fill_request_id"]
    url = f"{PROGRAMS}/{program_id}/contexts/doc/generate"
    answer = await client.post(url, json={"prompt": "Q: revenue?", "max_tokens": 5})
    assert answer.status_code == 202, answer.text
    fill_record = await queue.get(fill_id)
    gen_record = await queue.get(answer.json()["request_id"])
    assert fill_record is not None
    assert gen_record is not None
    fill_request, gen = fill_record.request, gen_record.request
    assert (fill_request.prompt, fill_request.max_output_tokens) == (DOCUMENT, 1)
    assert gen.prompt == DOCUMENT + "Q: revenue?"
    assert gen.max_output_tokens == 5
    # the whole document is leading blocks of both: the prefix index sends the generation
    # where the fill went (qlm/prefixes/affinity.py)
    assert len(fill_request.prefix) == 6  # five whole blocks and the cut at the text's end
    assert gen.prefix[: len(fill_request.prefix)] == fill_request.prefix
    assert gen.tenant == fill_request.tenant == "default"


async def test_a_fork_and_a_child_share_the_parent_s_text_and_blocks(
    client: httpx.AsyncClient, agent: FakeAgent, queue: MemoryQueue, runner: ProgramRunner
) -> None:
    agent.serving = False
    program_id = await session(client)
    await fill(client, program_id, name="doc", model="m7b", text=DOCUMENT)
    base = f"{PROGRAMS}/{program_id}/contexts"
    forked = await client.post(f"{base}/doc/fork", json={"name": "copy"})
    assert forked.status_code == 201, forked.text
    assert forked.json()["fill_request_id"] is None  # nothing computed
    child = await fill(client, program_id, name="chat", parent="doc", text="User: hi\n")
    assert child.status_code == 201, child.text
    assert child.json()["model"] == "m7b"
    ids = [
        (await client.post(f"{base}/{name}/generate", json={"prompt": "A:"})).json()["request_id"]
        for name in ("copy", "chat")
    ]
    records = [await queue.get(i) for i in ids]
    prompts = [r.request.prompt for r in records if r is not None]
    assert prompts == [DOCUMENT + "A:", DOCUMENT + "User: hi\nA:"]
    listed = (await client.get(base)).json()["data"]
    assert sorted(c["name"] for c in listed) == ["chat", "copy", "doc"]


async def test_contexts_end_with_their_program_and_free_forgets_one(
    client: httpx.AsyncClient, agent: FakeAgent, queue: MemoryQueue, runner: ProgramRunner
) -> None:
    program_id = await session(client)
    base = f"{PROGRAMS}/{program_id}/contexts"
    for name in ("a", "b"):
        assert (await fill(client, program_id, name=name, model="m7b", text="x")).status_code == 201
    assert (await client.delete(f"{base}/a")).status_code == 204
    assert (await client.delete(f"{base}/a")).status_code == 404
    assert [c["name"] for c in (await client.get(base)).json()["data"]] == ["b"]

    async def filled() -> bool:
        record = await queue.get(f"{program_id}.ctx.b.fill")
        return record is not None and record.state is RequestState.COMPLETED

    await wait_until(filled)  # the fake agent served the fill
    assert (await client.post(f"{PROGRAMS}/{program_id}/cancel")).status_code == 202

    async def ended() -> bool:
        return (await client.get(f"{PROGRAMS}/{program_id}")).json()["status"] != "running"

    await wait_until(ended)
    assert (await client.get(f"{PROGRAMS}/{program_id}")).json()["status"] == "cancelled"
    assert (await client.get(base)).json()["data"] == []
    late = await fill(client, program_id, name="c", model="m7b", text="x")
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "program_ended"


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("", {"name": "d", "text": "x"}, 400, "model"),
        ("", {"name": "d", "text": "x", "parent": "nope"}, 404, "parent"),
        ("", {"name": "bad.name", "model": "m7b", "text": "x"}, 400, "name"),
        ("", {"name": "doc", "model": "m7b", "text": "x"}, 409, "name"),
        ("", {"name": "d", "model": "other", "text": "x", "parent": "doc"}, 400, "model"),
        ("/doc/generate", {"prompt": "x", "sampling": {"logprobs": 2}}, 400, "sampling"),
        ("/nope/generate", {"prompt": "x"}, 404, "name"),
        ("/nope/fork", {"name": "e"}, 404, "name"),
    ],
)
async def test_bad_calls_are_refused_naming_the_field(
    client: httpx.AsyncClient,
    agent: FakeAgent,
    runner: ProgramRunner,
    path: str,
    body: dict[str, Any],
    status: int,
    param: str,
) -> None:
    agent.serving = False
    program_id = await session(client)
    assert (await fill(client, program_id, name="doc", model="m7b", text="x")).status_code == 201
    response = await client.post(f"{PROGRAMS}/{program_id}/contexts{path}", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


async def test_another_tenant_s_or_an_unknown_program_has_no_contexts(
    client: httpx.AsyncClient, runner: ProgramRunner
) -> None:
    response = await fill(client, "prog-nope", name="d", model="m7b", text="x")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "program_not_found"
