"""The client's sampling settings travel with the queued request to the engine."""

from __future__ import annotations

import httpx

from qlm.queue.memory import MemoryQueue


async def test_sampling_fields_are_queued_with_the_request(
    client: httpx.AsyncClient, queue: MemoryQueue
) -> None:
    body = {
        "kind": "completion",
        "model": "m7b",
        "prompt": "hello",
        "max_tokens": 3,
        "temperature": 0.3,
        "top_p": 0.9,
        "stop": ["\n"],
        "seed": 11,
        "ignore_eos": True,
        "slo_class": "batch-2",
    }
    resp = await client.post("/v1/qlm/requests", json=body)
    assert resp.status_code == 202, resp.text
    record = await queue.get(resp.json()["id"])
    assert record is not None
    assert record.request.sampling == {
        "temperature": 0.3,
        "top_p": 0.9,
        "stop": ["\n"],
        "seed": 11,
        "ignore_eos": True,
    }


async def test_unset_sampling_fields_are_left_to_the_engine(
    client: httpx.AsyncClient, queue: MemoryQueue
) -> None:
    body = {"kind": "completion", "model": "m7b", "prompt": "hi", "slo_class": "batch-2"}
    resp = await client.post("/v1/qlm/requests", json=body)
    assert resp.status_code == 202, resp.text
    record = await queue.get(resp.json()["id"])
    assert record is not None
    assert record.request.sampling == {}
