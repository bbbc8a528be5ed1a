"""The client-latency benchmark's arithmetic: client-side and server-side time to first token
and attainment from the same interactive requests, refused submissions counted, and targets
judged from them."""

from __future__ import annotations

from benchmarks.client_latency import render, summarise
from benchmarks.control_plane.streams import StreamSample


def sample(ttft_s: float | None) -> StreamSample:
    first = None if ttft_s is None else 10.0 + ttft_s
    return StreamSample(10.0, first, 12.0, 16, 8, request_id="r")


def test_client_and_server_views_side_by_side() -> None:
    streams = [sample(0.5), sample(1.5), sample(2.5), sample(None)]  # target 2 s
    server_ms = [400.0, 1400.0, 1900.0]  # the server saw the third in time, the client not
    row = summarise(300.0, 6.0, streams, [3.0, None, 5.0], server_ms)
    assert (row["requests"], row["interactive"], row["interactive_ok"]) == (7, 4, 3)
    assert row["client_attainment"] == 2 / 4
    assert row["server_attainment"] == 3 / 4
    assert row["enqueue_errors"] == 1
    assert row["client_ttft_p99_ms"] is not None
    text = render({"rows": [row], "speedup": 20.0, **HEADER})
    assert (
        "| client and server attainment within 1 point | 300 req/s | 25.0 points | MISS |" in text
    )
    assert "| client TTFT p99 <= 1 s | 300 req/s |" in text


HEADER = {
    "command": "x",
    "date": "d",
    "machine": "m",
    "platform": "p",
    "code": "c",
}
