"""kill -9 the agent running a program's call and the API process whose runner moves the
program along, in the middle of a chain; new processes finish it: every call answered exactly
once (one DONE event each), every variable known, each step's prompt holding the step before's
output."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from qlm.programs.python_client import ProgramBuilder
from qlm.types import RequestState
from tests.faults.harness import MODEL, FaultPlane, fleet_config, redis_for_faults
from tests.faults.report import FaultReport
from tests.redis_server import redis_server_binary

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]

STEPS = 6
TOKENS = 50  # 1 s each on the emulated engine


def chain() -> ProgramBuilder:
    p = ProgramBuilder(MODEL, max_tokens=TOKENS)
    previous = p.input("topic", "queues")
    for i in range(STEPS):
        previous = p.call(f"s{i}", f"Step {i} after: {previous}")
    return p


async def program_view(url: str, program_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        response = await http.get(f"/v1/qlm/programs/{program_id}")
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


async def test_a_program_survives_kill_9_of_its_agent_and_api(tmp_path: Path) -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    report = FaultReport("program, kill -9 of the agent running a call and of the API")
    with (
        redis_for_faults() as redis_server,
        FaultPlane(fleet_config(redis_server.url), tmp_path) as plane,
    ):
        try:
            first = (plane.api(), plane.controller(), plane.agent("i-0"))
            await plane.ready(*first)
            async with httpx.AsyncClient(base_url=first[0].url, timeout=30) as http:
                created = await http.post("/v1/qlm/programs", json=chain().body())
            assert created.status_code == 201, created.text
            program_id = created.json()["id"]
            while len((seen := await program_view(first[0].url, program_id))["outputs"]) < 2:
                await asyncio.sleep(0.05)
            running = [c["name"] for c in seen["calls"] if c["state"] == "queued"]
            assert running, "no call in flight at the kill"
            report.note(f"killed with {len(seen['outputs'])} of {STEPS} calls done, {running} on")
            first[0].kill9()
            first[2].kill9()
            second = (plane.api(), plane.agent("i-0"))
            await plane.ready(*second)
            for _ in range(1200):
                seen = await program_view(second[0].url, program_id)
                if seen["status"] != "running":
                    break
                await asyncio.sleep(0.1)
            assert seen["status"] == "completed", seen
            ids = [c["request_id"] for c in seen["calls"]]
            for rid in ids:
                report.accept(rid, "program call")
            for i, record in enumerate(await plane.records(ids)):
                rid = ids[i]
                if record is None or record.state is not RequestState.COMPLETED:
                    continue
                report.complete(rid)
                if (events := await plane.done_events(rid)) != 1:
                    report.duplicate(rid, f"{events} DONE events")
                if i and seen["outputs"][f"s{i - 1}"] not in (record.request.prompt or ""):
                    report.duplicate(rid, "its prompt lacks the step before's output")
            assert sorted(seen["outputs"]) == [f"s{i}" for i in range(STEPS)]
        finally:
            await plane.aclose()
    report.check()
