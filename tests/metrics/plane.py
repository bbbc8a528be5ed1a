"""A small live plane for the metric tests: emulated engines following a tiny inline profile,
fast loops, and helpers to read /metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from qlm.config.serve_config import ServeConfig
from qlm.serve.runtime import Plane

PROFILE = {
    "gpu_type": "A100",
    "weight_bytes": 14 << 30,
    "kv_bytes_per_token": 128 * 1024,
    "decode_table": {"batch_sizes": [1, 2], "step_s": [0.02, 0.02]},
    "prefill_tokens_per_s": 100_000,
    "output_tokens_mean": 100,
    "output_tokens_std": 10,
    "load_s": 0.5,
    "max_batch_size": 2,
}
CLASSES = [
    {"name": "interactive", "ttft_s": 2.0, "lateness_weight": 100, "priority": 2},
    {"name": "batch-2", "ttft_s": 600.0, "lateness_weight": 1, "priority": 0},
]


def plane_config(
    instances: Sequence[Mapping[str, Any]], *, speedup: float = 1.0, **sections: Any
) -> ServeConfig:
    data: dict[str, Any] = {
        "qlm": {
            "slo_classes": CLASSES,
            "planner": {"policy": "edf"},
            "control": {"tick_s": 0.05},
        },
        "api": {"port": 0},
        "agent": {"poll_s": 0.01, "status_every_s": 0.1},
        "engine": {"kind": "emulated", "speedup": speedup, "output_length": "cap"},
        "models": [{"name": "m-a"}, {"name": "m-b"}],
        "fleet": {
            "packaged_profiles": False,
            "profiles": [{"model": m, **PROFILE} for m in ("m-a", "m-b")],
            "instances": list(instances),
        },
        "metrics": {"sample_every_s": 0.2},
    }
    data.update(sections)
    return ServeConfig.model_validate(data)


async def submit(
    http: httpx.AsyncClient, n: int, model: str, max_tokens: int, **tags: Any
) -> list[str]:
    ids = []
    for i in range(n):
        body = {
            "kind": "completion",
            "model": model,
            "prompt": f"item {i}",
            "max_tokens": max_tokens,
        }
        response = await http.post("/v1/qlm/requests", json={**body, **tags})
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    return ids


async def wait_done(plane: Plane, ids: Sequence[str], timeout_s: float = 60.0) -> None:
    async def all_done() -> None:
        while True:
            records = await asyncio.gather(*(plane.queue.get(i) for i in ids))
            if all(r is not None and r.state.is_terminal for r in records):
                return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(all_done(), timeout_s)


def sample_sums(text: str, name: str, by: str) -> dict[str, float]:
    """sum by (`by`) of one sample name in an exposition text."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[s.labels.get(by, "")] = out.get(s.labels.get(by, ""), 0.0) + s.value
    return out


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of the series of `name` matching `labels` (0 when none)."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def serve_fleet(port: int) -> dict[str, Any]:
    """A fleet file for `qlm serve|api|controller|agent` processes: two emulated instances."""
    return {
        "qlm": {
            "slo_classes": CLASSES,
            "planner": {"policy": "edf"},
            "control": {"tick_s": 0.05},
        },
        "api": {"host": "127.0.0.1", "port": port},
        "agent": {"poll_s": 0.01, "status_every_s": 0.2},
        "engine": {"kind": "emulated", "speedup": 20.0, "output_length": "cap"},
        "models": [{"name": "m-a"}, {"name": "m-b"}],
        "fleet": {
            "packaged_profiles": False,
            "profiles": [{"model": m, **PROFILE} for m in ("m-a", "m-b")],
            "instances": [{"id": "gpu", "gpu_type": "A100", "model": "m-a", "count": 2}],
        },
        "metrics": {"sample_every_s": 0.5},
    }


def run_requests(url: str, n_ok: int, n_late: int) -> None:
    """n_ok interactive requests that meet their SLO, n_late that cannot (1 ms TTFT), and
    wait until all are done."""
    ids = []
    with httpx.Client(base_url=url, timeout=30) as http:
        for i in range(n_ok + n_late):
            body: dict[str, Any] = {
                "kind": "completion",
                "model": "m-a",
                "prompt": f"q{i}",
                "max_tokens": 4,
                "slo_class": "interactive",
            }
            if i >= n_ok:
                body["slo_ttft_s"] = 0.001
            response = http.post("/v1/qlm/requests", json=body)
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
        deadline = time.monotonic() + 60
        while ids and time.monotonic() < deadline:
            ids = [
                i for i in ids if http.get(f"/v1/qlm/requests/{i}").json()["state"] != "completed"
            ]
            time.sleep(0.1)
    assert not ids, f"not completed: {ids}"
