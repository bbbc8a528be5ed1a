"""benchmarks/engine_http.py runs end to end on a tiny load and records both clients."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import engine_http


def test_both_clients_stream_every_chunk_and_are_recorded(tmp_path: Path) -> None:
    out = tmp_path / "engine_http.json"
    args = ["--requests", "4", "--concurrency", "2", "--tokens", "3", "--gap-ms", "0"]
    assert engine_http.main([*args, "--rounds", "1", "--no-docs", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data["median_cpu_ms"]) == {"httpx", "aiohttp"}
    assert all(v > 0 for v in data["median_cpu_ms"].values())
    assert data["ratio"] > 0
