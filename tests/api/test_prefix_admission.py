"""Requests admitted through the API carry their prompt's prefix blocks
(qlm/prefixes/prompt_blocks.py), so that dispatch and the engines can share what their prompts
share."""

from __future__ import annotations

import httpx

from qlm.prefixes.prompt_blocks import PREFIX_BLOCK_CHARS
from qlm.queue.memory import MemoryQueue

SYSTEM = "You are a careful assistant. " * 40  # 1,160 characters: four whole blocks


async def test_requests_admitted_through_the_api_carry_their_prompt_blocks(
    client: httpx.AsyncClient, queue: MemoryQueue
) -> None:
    ids = []
    for question in ("What is the capital of France?", "Summarise this contract."):
        body = {"kind": "completion", "model": "m7b", "prompt": SYSTEM + question}
        resp = await client.post("/v1/qlm/requests", json={**body, "max_tokens": 2})
        assert resp.status_code == 202, resp.text
        ids.append(resp.json()["id"])
    records = [await queue.get(request_id) for request_id in ids]
    prefixes = [record.request.prefix for record in records if record is not None]
    assert len(prefixes) == 2
    assert len(prefixes[0]) == len(prefixes[1]) == len(SYSTEM) // PREFIX_BLOCK_CHARS
    assert prefixes[0] == prefixes[1]  # the questions are shorter than a block: own parts
    first = records[0]
    assert first is not None
    assert sum(b.tokens for b in prefixes[0]) <= first.request.prompt_tokens
