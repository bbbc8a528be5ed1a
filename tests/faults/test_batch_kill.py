"""kill -9 the API, the controller and the agent in the middle of a batch job, and Redis too
(restarted on its AOF); new processes finish the job: every line of the input is answered
exactly once (one output line per custom_id, one DONE event per line's request), none lost."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
import pytest

from tests.faults.harness import MODEL, FaultPlane, fleet_config, redis_for_faults
from tests.faults.report import FaultReport
from tests.redis_server import redis_server_binary

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]

LINES = 30
TOKENS = 50  # 1 s each on the emulated engine


def batch_input() -> bytes:
    lines = []
    for k in range(LINES):
        body = {"model": MODEL, "prompt": f"document {k}", "max_tokens": TOKENS}
        line = {"custom_id": f"doc-{k}", "method": "POST", "url": "/v1/completions", "body": body}
        lines.append(json.dumps(line))
    return ("\n".join(lines) + "\n").encode()


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=5)


async def test_a_batch_job_survives_kill_9_of_every_process_and_redis(tmp_path: Path) -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    report = FaultReport("batch job, kill -9 of API, controller, agent and Redis")
    with (
        redis_for_faults(appendfsync="always") as redis_server,
        FaultPlane(fleet_config(redis_server.url), tmp_path) as plane,
    ):
        try:
            first = (plane.api(), plane.controller(), plane.agent("i-0", "i-1"))
            await plane.ready(*first)
            api = client(first[0].url)
            upload = await api.files.create(file=("docs.jsonl", batch_input()), purpose="batch")
            batch = await api.batches.create(
                input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h"
            )
            while True:
                seen = await api.batches.retrieve(batch.id)
                counts = seen.request_counts
                if counts is not None and counts.completed >= 2:
                    break
                await asyncio.sleep(0.05)
            assert counts.completed < LINES, "the job ended before the kill"
            report.note(f"killed with {counts.completed} of {LINES} lines done")
            for proc in first:
                proc.kill9()
            redis_server.kill9()
            redis_server.restart()
            second = (plane.api(), plane.controller(), plane.agent("i-0", "i-1"))
            await plane.ready(*second)
            api = client(second[0].url)
            for _ in range(1200):
                done = await api.batches.retrieve(batch.id)
                if done.status == "completed":
                    break
                await asyncio.sleep(0.1)
            assert done.status == "completed", done
            assert done.output_file_id is not None
            output = (await api.files.content(done.output_file_id)).text.splitlines()
            for k in range(LINES):
                report.accept(f"{batch.id}-{k + 1}", "batch line")
            for line in output:
                answer = json.loads(line)
                rid = answer["response"]["request_id"]
                report.complete(rid)
                text = answer["response"]["body"]["choices"][0]["text"]
                if answer["response"]["body"]["usage"]["completion_tokens"] != TOKENS or not text:
                    report.duplicate(rid, "its answer is not the whole output")
            for k in range(LINES):
                rid = f"{batch.id}-{k + 1}"
                if (events := await plane.done_events(rid)) != 1:
                    report.duplicate(rid, f"{events} DONE events")
        finally:
            await plane.aclose()
    report.check()
