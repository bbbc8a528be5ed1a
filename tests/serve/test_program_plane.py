"""A program on the live plane (emulated engines) with its state in a real redis-server: a
chain whose steps run without a client round trip, stopped mid-way with every process of the
plane; a new plane on the same Redis finishes it, each call answered once (a call running at
the stop runs again, as any request does when its agent goes)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from qlm.programs.python_client import ProgramBuilder
from qlm.serve.runtime import running_plane
from qlm.types import RequestState
from tests.serve.test_plane import config

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
STEPS = 6


def chain() -> ProgramBuilder:
    p = ProgramBuilder("m-a", max_tokens=24, deadline_s=120.0)
    previous = p.input("topic", "queues")
    for i in range(STEPS):
        previous = p.call(f"step{i}", f"Step {i}, go on from: {previous}")
    return p


async def view(http: httpx.AsyncClient, program_id: str) -> dict[str, Any]:
    response = await http.get(f"/v1/qlm/programs/{program_id}")
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


async def test_a_chain_survives_a_restart_of_every_process_and_runs_each_call_once(
    redis_url: str,
) -> None:
    queue = {"url": redis_url, "key_prefix": "programs:"}
    cfg = config([{"id": "i", "gpu_type": "A100", "model": "m-a", "count": 2}], queue=queue)
    async with running_plane(cfg) as plane:
        base = f"http://127.0.0.1:{plane.port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            created = await http.post("/v1/qlm/programs", json=chain().body())
            assert created.status_code == 201, created.text
            program_id = created.json()["id"]
            while len((await view(http, program_id))["outputs"]) < 2:  # stop it mid-way
                await asyncio.sleep(0.02)
    async with running_plane(cfg) as plane:
        base = f"http://127.0.0.1:{plane.port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            seen = await view(http, program_id)
            assert seen["status"] == "running"
            for _ in range(600):
                seen = await view(http, program_id)
                if seen["status"] != "running":
                    break
                await asyncio.sleep(0.05)
            records = [await plane.queue.get(c["request_id"]) for c in seen["calls"]]
    assert seen["status"] == "completed", seen
    assert sorted(seen["outputs"]) == [f"step{i}" for i in range(STEPS)]
    for i, record in enumerate(records):
        assert record is not None
        assert record.state is RequestState.COMPLETED
        assert record.result is not None  # answered once: the program keeps that answer
        assert seen["outputs"][f"step{i}"] == record.result.text
        if i:  # each step's prompt carries the previous step's output, filled in server-side
            assert seen["outputs"][f"step{i - 1}"] in (record.request.prompt or "")
