"""Programs through the API, in process: a fake agent serves the calls and the program runner
runs beside it. Outputs travel server-side, calls wait for their inputs, bad graphs are
refused naming the call and the variable, a failed call fails only what uses it, and an
end-to-end deadline becomes each call's deadlines."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from qlm.api import create_app
from qlm.api.program_runner import ProgramRunner
from qlm.clock import VirtualClock
from qlm.programs.graph import ProgramCall
from qlm.programs.python_client import ProgramBuilder
from qlm.programs.state import Program, ProgramStatus
from qlm.queue.memory import MemoryQueue
from qlm.types import RequestState
from tests.api.conftest import NOW_S, make_settings, wait_until
from tests.api.fake_agent import FakeAgent

PROGRAMS = "/v1/qlm/programs"


def map_reduce(chunks: int = 3, **options: Any) -> ProgramBuilder:
    p = ProgramBuilder("m7b", max_tokens=8, **options)
    parts = [p.call(f"s{i}", "Summarise: " + p.input(f"c{i}", f"chunk {i}")) for i in range(chunks)]
    p.call("merged", "Merge: " + " | ".join(parts))
    return p


async def finished(client: httpx.AsyncClient, program_id: str) -> dict[str, Any]:
    view: dict[str, Any] = {}

    async def done() -> bool:
        nonlocal view
        view = (await client.get(f"{PROGRAMS}/{program_id}")).json()
        return view["status"] != "running"

    await wait_until(done, timeout_s=10)
    return view


async def test_map_reduce_merges_the_maps_outputs_server_side_once_they_are_done(
    client: httpx.AsyncClient, agent: FakeAgent, queue: MemoryQueue, runner: ProgramRunner
) -> None:
    agent.serving = False
    response = await client.post(PROGRAMS, json=map_reduce().body())
    assert response.status_code == 201, response.text
    program_id = response.json()["id"]

    async def maps_queued() -> bool:
        return len(await queue.queued()) == 3

    await wait_until(maps_queued)
    await asyncio.sleep(0.05)  # the merge must not be queued before its inputs exist
    assert sorted(r.id.rsplit(".", 1)[1] for r in await queue.queued()) == ["s0", "s1", "s2"]
    agent.serving = True
    view = await finished(client, program_id)
    assert view["status"] == "completed"
    assert view["results"] == ["merged"]
    merge = await queue.get(f"{program_id}.merged")
    assert merge is not None
    assert merge.request.prompt == "Merge: " + " | ".join([view["outputs"]["s0"]] * 3)
    assert view["outputs"]["s0"].startswith("w0 w1")
    heads = set()
    for i in range(3):  # the maps share their template's head, "Summarise: ", as a block
        record = await queue.get(f"{program_id}.s{i}")
        assert record is not None
        heads.add(record.request.prefix[0])
    assert len(heads) == 1
    assert merge.request.prefix[0] not in heads
    variable = (await client.get(f"{PROGRAMS}/{program_id}/variables/merged")).json()
    assert (variable["state"], variable["value"]) == ("completed", view["outputs"]["merged"])


async def test_a_variable_read_can_wait_for_its_value(
    client: httpx.AsyncClient, agent: FakeAgent, runner: ProgramRunner
) -> None:
    agent.serving = False
    program_id = (await client.post(PROGRAMS, json=map_reduce(1).body())).json()["id"]
    url = f"{PROGRAMS}/{program_id}/variables/merged"
    assert (await client.get(url)).json()["state"] in ("waiting", "queued")
    read = asyncio.create_task(client.get(url, params={"wait_s": 5}))
    await asyncio.sleep(0.1)
    assert not read.done()
    agent.serving = True
    variable = (await read).json()
    assert variable["state"] == "completed"
    assert variable["value"]
    assert (await client.get(f"{PROGRAMS}/{program_id}/variables/c0")).json()["value"] == "chunk 0"


@pytest.mark.parametrize(
    ("calls", "param", "words"),
    [
        ([{"name": "a", "model": "m7b", "prompt": "x {{nope}}"}], "calls[0].prompt",
         ["'a'", "'nope'"]),
        ([{"name": "a", "model": "m7b", "prompt": "{{b}}"},
          {"name": "b", "model": "m7b", "prompt": "{{a}}"}], "calls[0].prompt", ["cycle"]),
        ([{"name": "a", "model": "no-such", "prompt": "x"}], "calls[0].model", ["'a'"]),
        ([{"name": "a", "model": "m7b", "prompt": "x", "sampling": {"temperature": 9}}],
         "calls[0].temperature", ["'a'"]),
        ([{"name": "a", "model": "m7b", "prompt": "x", "max_tokens": 0}], "calls[0].max_tokens",
         []),
        ([{"name": "a", "model": "m7b", "prompt": "x", "sampling": {"prompt": "y"}}],
         "calls[0].sampling", ["'prompt' is not a sampling field"]),
        ([{"name": "a", "model": "m7b", "prompt": "x", "sampling": {"logprobs": True}}],
         "calls[0].sampling", ["'logprobs' is not a sampling field"]),
        ([{"name": "a\n", "model": "m7b", "prompt": "x"}], "calls[0].name", ["not a valid"]),
    ],
)  # fmt: skip
async def test_a_bad_program_is_refused_naming_the_call_and_the_field(
    client: httpx.AsyncClient, calls: list[dict[str, Any]], param: str, words: list[str]
) -> None:
    response = await client.post(PROGRAMS, json={"calls": calls})
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert all(w in error["message"] for w in words), error


async def test_a_failed_call_fails_what_uses_it_and_the_rest_goes_on(
    client: httpx.AsyncClient, agent: FakeAgent, queue: MemoryQueue, runner: ProgramRunner
) -> None:
    agent.serving = False
    p = ProgramBuilder("m7b", max_tokens=4)
    a = p.call("a", "first")
    p.call("b", "uses " + a)
    p.call("c", "alone")
    program_id = (await client.post(PROGRAMS, json=p.body())).json()["id"]

    async def both_queued() -> bool:
        return len(await queue.queued()) == 2

    await wait_until(both_queued)
    cancel = await client.delete(f"/v1/qlm/requests/{program_id}.a")
    assert cancel.status_code == 200, cancel.text
    agent.serving = True
    view = await finished(client, program_id)
    states = {c["name"]: (c["state"], c["error"]) for c in view["calls"]}
    assert view["status"] == "failed"
    assert states["a"] == ("failed", "cancelled")
    assert states["b"] == ("failed", "not run: its input 'a' failed")
    assert states["c"] == ("completed", None)
    assert await queue.get(f"{program_id}.b") is None  # never queued


async def test_an_end_to_end_deadline_becomes_each_calls_deadlines(
    client: httpx.AsyncClient, agent: FakeAgent, queue: MemoryQueue, runner: ProgramRunner
) -> None:
    response = await client.post(PROGRAMS, json=map_reduce(2, deadline_s=30.0).body())
    view = response.json()
    assert view["deadline_at"] == NOW_S + 30.0
    calls = {c["name"]: c for c in view["calls"]}
    assert calls["merged"]["deadline_at"] == pytest.approx(NOW_S + 30.0)
    assert NOW_S < calls["s0"]["deadline_at"] < calls["merged"]["deadline_at"]
    assert calls["s0"]["ttft_deadline_at"] < calls["s0"]["deadline_at"]
    view = await finished(client, view["id"])
    record = await queue.get(f"{view['id']}.s1")
    assert record is not None
    assert record.state is RequestState.COMPLETED
    assert record.request.completion_deadline_at_s == pytest.approx(calls["s1"]["deadline_at"])
    assert record.request.ttft_deadline_at_s == pytest.approx(calls["s1"]["ttft_deadline_at"])


async def test_cancel_ends_what_has_not_ended(
    client: httpx.AsyncClient, agent: FakeAgent, queue: MemoryQueue, runner: ProgramRunner
) -> None:
    agent.serving = False
    program_id = (await client.post(PROGRAMS, json=map_reduce(2).body())).json()["id"]

    async def queued() -> bool:
        return len(await queue.queued()) == 2

    await wait_until(queued)
    assert (await client.post(f"{PROGRAMS}/{program_id}/cancel")).status_code == 202
    view = await finished(client, program_id)
    assert view["status"] == "cancelled"
    assert {c["state"] for c in view["calls"]} == {"failed"}
    assert not await queue.queued()
    listed = (await client.get(PROGRAMS)).json()["data"]
    assert [p["id"] for p in listed] == [program_id]
    assert (await client.get(f"{PROGRAMS}/prog-unknown")).status_code == 404


async def test_an_input_no_call_uses_is_refused(client: httpx.AsyncClient) -> None:
    body = {"calls": [{"name": "a", "model": "m7b", "prompt": "x"}], "inputs": {"extra": "y"}}
    response = await client.post(PROGRAMS, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "inputs"
    assert "'extra' is used by no call" in response.json()["error"]["message"]


async def test_a_call_whose_record_is_gone_fails_instead_of_waiting_forever(
    app: FastAPI, queue: MemoryQueue
) -> None:
    store, runner = app.state.program_store, app.state.program_runner
    p = ProgramBuilder("m7b", max_tokens=4)
    a = p.call("a", "first")
    p.call("b", "then " + a)
    program = Program("prog-x", "default", NOW_S, None, None,
                      tuple(ProgramCall(c["name"], "m7b", c["prompt"], 4) for c in p.calls), {},
                      queued=("a",))  # fmt: skip
    await store.put(program)  # "a" was queued, but the queue has no record of it any more
    after = await runner.advance(program)
    assert after.status is ProgramStatus.FAILED
    assert "record expired" in after.errors["a"]
    assert after.errors["b"] == "not run: its input 'a' failed"


async def test_a_program_is_charged_to_its_tenants_quota_as_a_whole(
    queue: MemoryQueue, clock: VirtualClock
) -> None:
    app = create_app(make_settings(quota={"tokens_per_min": 500}), queue, clock)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        small = await http.post(PROGRAMS, json=map_reduce(2).body())
        assert small.status_code == 201, small.text
        big = ProgramBuilder("m7b", max_tokens=450)
        big.call("a", "long answer")
        refused = await http.post(PROGRAMS, json=big.body())
    assert refused.status_code == 429, refused.text
    assert "retry-after" in refused.headers


async def test_map_calls_reading_one_paper_wait_for_the_first_to_compute_it(
    client: httpx.AsyncClient, agent: FakeAgent, queue: MemoryQueue, runner: ProgramRunner
) -> None:
    """Parrot's fork (qlm/programs/fork.py): maps ready together whose prompts start with the
    same paper carry the first map as their leader; the merge, alone in its round, none."""
    agent.serving = False
    p = ProgramBuilder("m7b", max_tokens=8)
    paper = p.input("paper", "A paper about queues. " * 40)
    maps = [p.call(f"s{i}", f"{paper}\nSummarise part {i + 1}.") for i in range(3)]
    p.call("merged", "Merge: " + " | ".join(maps))
    response = await client.post(PROGRAMS, json=p.body())
    assert response.status_code == 201, response.text
    program_id = response.json()["id"]

    async def maps_queued() -> bool:
        return len(await queue.queued()) == 3

    await wait_until(maps_queued)
    leaders = {r.id.rsplit(".", 1)[1]: r.job_leader for r in await queue.queued()}
    assert leaders == {"s0": None, "s1": f"{program_id}.s0", "s2": f"{program_id}.s0"}
    agent.serving = True
    view = await finished(client, program_id)
    assert view["status"] == "completed"
    merge = await queue.get(f"{program_id}.merged")
    assert merge is not None
    assert merge.request.job_leader is None
