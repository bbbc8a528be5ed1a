"""The main job (`qlm demo`, `make run`): start the embedded control plane, drive a short mixed
interactive + batch workload at it over HTTP, and print SLO attainment per class.

Interactive requests are streamed chat completions (TTFT measured by the client); batch work
goes through the asynchronous API and is polled by id. Attainment counts a request as met when
its first token came by its TTFT deadline, as the server recorded it."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from qlm.clock import WallClock
from qlm.config.serve_config import ServeConfig
from qlm.queue.queue_protocol import GlobalQueue
from qlm.serve.runtime import running_plane
from qlm.types import RequestState


@dataclass(frozen=True, slots=True)
class DemoLoad:
    duration_s: float = 20.0
    interactive_rps: float = 2.0
    batch1_requests: int = 60
    batch2_requests: int = 300
    max_tokens: int = 128
    seed: int = 0


@dataclass(frozen=True, slots=True)
class DemoReport:
    accepted: int
    completed: int
    met: dict[str, int]
    total: dict[str, int]
    client_ttft_s: tuple[float, ...]
    swaps: int
    evictions: int
    replans: int

    def attainment(self, slo_class: str) -> float:
        return self.met.get(slo_class, 0) / max(1, self.total.get(slo_class, 0))

    def table(self) -> str:
        rows = [f"{'class':<12}{'requests':>9}{'met':>6}{'attainment':>12}"]
        for name in sorted(self.total):
            rows.append(
                f"{name:<12}{self.total[name]:>9}{self.met.get(name, 0):>6}"
                f"{100 * self.attainment(name):>11.1f}%"
            )
        overall = sum(self.met.values()) / max(1, sum(self.total.values()))
        rows.append(
            f"{'overall':<12}{sum(self.total.values()):>9}{sum(self.met.values()):>6}"
            f"{100 * overall:>11.1f}%"
        )
        ttft = sorted(self.client_ttft_s)
        if ttft:
            rows.append(
                f"interactive TTFT seen by the client: p50 {ttft[len(ttft) // 2]:.2f} s, "
                f"max {ttft[-1]:.2f} s"
            )
        rows.append(
            f"accepted {self.accepted}, completed {self.completed}; model swaps {self.swaps}, "
            f"evictions {self.evictions}, re-plans {self.replans}"
        )
        return "\n".join(rows)


async def run_demo(config: ServeConfig, load: DemoLoad) -> DemoReport:
    config = config.model_copy(update={"api": config.api.model_copy(update={"port": 0})})
    async with running_plane(config) as plane:
        base = f"http://{config.api.host}:{plane.port}"
        async with httpx.AsyncClient(base_url=base, timeout=600.0) as client:
            models = [m.name for m in config.models]
            batch_ids = await _submit_batch(client, models, load)
            ttfts, interactive_ids = await _interactive(client, models, load)
            await _wait_all(client, batch_ids)
        met, total, completed = await _score(plane.queue, [*batch_ids, *interactive_ids])
        replans = plane.loop.counters.replans if plane.loop else 0
        return DemoReport(
            accepted=len(batch_ids) + len(interactive_ids),
            completed=completed,
            met=met,
            total=total,
            client_ttft_s=tuple(ttfts),
            swaps=sum(a.counters.swaps for a in plane.agents),
            evictions=sum(a.counters.evictions for a in plane.agents),
            replans=replans,
        )


async def _submit_batch(client: httpx.AsyncClient, models: list[str], load: DemoLoad) -> list[str]:
    rng = random.Random(load.seed)
    bodies = [("batch-1", i) for i in range(load.batch1_requests)]
    bodies += [("batch-2", i) for i in range(load.batch2_requests)]
    ids = []
    for slo_class, i in bodies:
        body = {
            "kind": "completion",
            "model": rng.choice(models),
            "prompt": f"summarise document {i} " * rng.randint(20, 200),
            "max_tokens": load.max_tokens,
            "slo_class": slo_class,
        }
        response = await client.post("/v1/qlm/requests", json=body)
        response.raise_for_status()
        ids.append(response.json()["id"])
    return ids


async def _interactive(
    client: httpx.AsyncClient, models: list[str], load: DemoLoad
) -> tuple[list[float], list[str]]:
    rng = random.Random(load.seed + 1)
    loop = asyncio.get_running_loop()
    tasks = []
    elapsed = 0.0
    while elapsed < load.duration_s:
        gap = rng.expovariate(load.interactive_rps)
        await asyncio.sleep(gap)
        elapsed += gap
        tasks.append(asyncio.create_task(_chat(client, rng.choice(models), load, loop)))
    results = await asyncio.gather(*tasks)
    return [t for t, _ in results], [rid for _, rid in results]


async def _chat(
    client: httpx.AsyncClient, model: str, load: DemoLoad, loop: asyncio.AbstractEventLoop
) -> tuple[float, str]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "what is the capital of France? " * 8}],
        "max_tokens": load.max_tokens // 2,
        "stream": True,
    }
    start = loop.time()
    first = None
    async with client.stream(
        "POST", "/v1/chat/completions", json=body, headers={"x-qlm-slo-class": "interactive"}
    ) as response:
        response.raise_for_status()
        request_id = response.headers.get("x-qlm-request-id", "")
        async for line in response.aiter_lines():
            if first is None and _has_text(line):
                first = loop.time() - start
    return (first if first is not None else loop.time() - start), request_id


def _has_text(line: str) -> bool:
    """An SSE line carrying a chat chunk with non-empty content."""
    if not line.startswith("data:") or line.endswith("[DONE]"):
        return False
    choices = json.loads(line[5:]).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


async def _wait_all(client: httpx.AsyncClient, ids: Sequence[str]) -> None:
    pending = list(ids)
    while pending:
        states = await asyncio.gather(*(client.get(f"/v1/qlm/requests/{i}") for i in pending))
        pending = [
            i
            for i, r in zip(pending, states, strict=True)
            if not RequestState(r.json()["state"]).is_terminal
        ]
        if pending:
            await asyncio.sleep(0.5)


async def _score(
    queue: GlobalQueue, ids: Sequence[str]
) -> tuple[dict[str, int], dict[str, int], int]:
    met: Counter[str] = Counter()
    total: Counter[str] = Counter()
    completed = 0
    for record in await asyncio.gather(*(queue.get(i) for i in ids)):
        if record is None:
            continue
        request, result = record.request, record.result
        total[request.slo_class] += 1
        if result is None or result.state is not RequestState.COMPLETED:
            continue
        completed += 1
        first = result.first_token_at_s
        met[request.slo_class] += first is not None and first <= request.ttft_deadline_at_s
    return dict(met), dict(total), completed


def main_demo(config: ServeConfig, load: DemoLoad) -> int:
    report = asyncio.run(run_demo(config, load))
    print(report.table())
    return 0 if report.completed == report.accepted else 1


__all__ = ["DemoLoad", "DemoReport", "WallClock", "main_demo", "run_demo"]
