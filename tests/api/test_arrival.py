"""A request's arrival is when it reached the server, not when admission got to it: time spent
reading a slow body (or waiting for a busy event loop) counts against its deadlines."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from qlm.clock import VirtualClock
from tests.api.conftest import NOW_S

pytestmark = pytest.mark.timeout(60)


async def test_arrival_is_stamped_before_the_body_is_read(
    client: httpx.AsyncClient, clock: VirtualClock
) -> None:
    async def slow_body() -> AsyncIterator[bytes]:
        yield b'{"kind": "completion", "model": "m7b", '
        clock.advance_by(5.0)  # the rest of the body comes 5 s later
        yield b'"prompt": "hi", "max_tokens": 2, "slo_ttft_s": 20}'

    resp = await client.post("/v1/qlm/requests", content=slow_body())
    assert resp.status_code == 202, resp.text
    times = resp.json()["times"]
    assert times["arrival_at_s"] == NOW_S
    assert times["ttft_deadline_at_s"] == NOW_S + 20.0  # 15 s left, not 20
