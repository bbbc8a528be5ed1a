"""A batch job on the live plane with its state in a real redis-server: the official openai
client uploads the input and creates the job, every process of the plane stops while the job
runs, a new plane on the same Redis finishes it, and every line is answered exactly once."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from qlm.serve.runtime import running_plane
from tests.serve.test_plane import config

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

LINES = 40


def input_file() -> bytes:
    lines = []
    for k in range(LINES):
        body = {"model": "m-a", "prompt": f"document {k}", "max_tokens": 20}
        lines.append({"custom_id": f"doc-{k}", "method": "POST", "url": "/v1/completions",
                      "body": body})  # fmt: skip
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def test_a_batch_survives_a_restart_of_every_process_and_answers_each_line_once(
    redis_url: str,
) -> None:
    queue = {"url": redis_url, "key_prefix": "batch:"}
    instances = [{"id": "i", "gpu_type": "A100", "model": "m-a", "count": 2}]
    cfg = config(instances, queue=queue, lease_s=3.0)  # a stopped agent's lines come back soon
    async with running_plane(cfg) as plane:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{plane.port}/v1", api_key="x")
        uploaded = await client.files.create(file=("docs.jsonl", input_file()), purpose="batch")
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="1h"
        )
        estimates = []
        while True:  # stop the plane mid-job: some lines done, most not
            seen = await client.batches.retrieve(batch.id)
            estimates.append((seen.model_extra or {})["qlm"]["estimated_completion_at"])
            if seen.request_counts is not None and seen.request_counts.completed >= 2:
                break
            await asyncio.sleep(0.05)
    assert seen.status == "in_progress"
    # the plan's estimate of the job's end, once it has planned the lines: before its deadline
    planned = [eta for eta in estimates if eta is not None]
    assert planned
    assert all(batch.created_at <= eta <= (seen.expires_at or 0) for eta in planned)
    assert seen.request_counts is not None
    assert seen.request_counts.completed < LINES
    async with running_plane(cfg) as plane:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{plane.port}/v1", api_key="x")
        for _ in range(600):
            done = await client.batches.retrieve(batch.id)
            if done.status == "completed":
                break
            await asyncio.sleep(0.1)
        assert done.status == "completed", done
        assert done.output_file_id is not None
        output = (await client.files.content(done.output_file_id)).text.splitlines()
    answered = [json.loads(line)["custom_id"] for line in output]
    assert sorted(answered) == sorted(f"doc-{k}" for k in range(LINES))  # each exactly once
    assert done.error_file_id is None
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
