"""HTTP client cost of streaming from a vLLM-style server: CPU per streamed completion in the
client process, httpx against aiohttp, both as VllmEngine uses them (one fresh connection per
request, SSE chunks split into lines and parsed as JSON).

    .venv/bin/python -m benchmarks.engine_http [--requests 256] [--concurrency 16] [--rounds 3]

The server is a minimal SSE responder in a child process (raw asyncio, no framework) that
streams `--tokens` chunks shaped like vLLM's completion chunks with `--gap-ms` between them, so
what the client pays is what is measured. Rounds alternate the clients; the table gives each
client's median CPU milliseconds per stream (user + system, resource.getrusage of this process)
and the ratio, which is what VllmEngine's choice of client rests on
(qlm/engine/vllm/vllm_engine.py).
Writes results/engine_http.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from tests.redis_server import free_port

RESULTS_PATH = RESULTS_DIR / "engine_http.json"
BODY = {"model": "m", "prompt": "x", "max_tokens": 32, "stream": True}
CHUNK = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "text": " tok", "logprobs": None, "finish_reason": None}],
    "usage": {"prompt_tokens": 30, "completion_tokens": 1, "total_tokens": 31},
}


# ---------------------------------------------------------------- server (child process)


def serve(port: int, tokens: int, gap_s: float) -> None:
    data = f"data: {json.dumps(CHUNK)}\n\n".encode()
    done = b"data: [DONE]\n\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
            )
            for _ in range(tokens):
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
                await asyncio.sleep(gap_s)
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# ---------------------------------------------------------------- clients


def consume(data: bytes) -> int:
    tokens = 0
    for line in data.split(b"\n"):
        if line.startswith(b"data:") and b"[DONE]" not in line:
            json.loads(line[5:])
            tokens += 1
    return tokens


async def with_httpx(url: str, n: int, concurrency: int) -> int:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, trust_env=False) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one() -> int:
            async with gate, client.stream("POST", url, json=BODY) as response:
                return sum([consume(data) async for data in response.aiter_bytes()])

        return sum(await asyncio.gather(*(one() for _ in range(n))))


async def with_aiohttp(url: str, n: int, concurrency: int) -> int:
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        gate = asyncio.Semaphore(concurrency)

        async def one() -> int:
            async with gate, session.post(url, json=BODY) as response:
                return sum([consume(data) async for data in response.content.iter_any()])

        return sum(await asyncio.gather(*(one() for _ in range(n))))


Client = Callable[[str, int, int], Coroutine[Any, Any, int]]
CLIENTS: dict[str, Client] = {"httpx": with_httpx, "aiohttp": with_aiohttp}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(client: Client, url: str, args: argparse.Namespace) -> dict[str, float]:
    cpu0, wall0 = cpu_s(), time.perf_counter()
    tokens = asyncio.run(client(url, args.requests, args.concurrency))
    cpu, wall = cpu_s() - cpu0, time.perf_counter() - wall0
    if tokens != args.requests * args.tokens:
        raise SystemExit(f"expected {args.requests * args.tokens} chunks, got {tokens}")
    return {"cpu_ms_per_stream": cpu / args.requests * 1000, "wall_s": wall}


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=256, help="streams per round")
    parser.add_argument("--concurrency", type=int, default=16, help="streams at once")
    parser.add_argument("--tokens", type=int, default=32, help="chunks per stream")
    parser.add_argument("--gap-ms", type=float, default=5.0, help="server delay per chunk")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per client")
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    header = run_header("engine_http.py", sys.argv[1:], "shared machine")
    port = free_port()
    server = multiprocessing.Process(target=serve, args=(port, args.tokens, args.gap_ms / 1000))
    server.start()
    try:
        time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/v1/completions"
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in CLIENTS}
        for _ in range(args.rounds):
            for name, client in CLIENTS.items():
                runs[name].append(measure(client, url, args))
    finally:
        server.terminate()
        server.join()
    finish_header(header)
    medians = {
        name: statistics.median(r["cpu_ms_per_stream"] for r in rounds)
        for name, rounds in runs.items()
    }
    ratio = medians["aiohttp"] / medians["httpx"]
    lines = [
        "## vLLM engine client: CPU per streamed completion",
        "",
        *header_lines(header),
        "",
        f"{args.requests} streams x {args.tokens} SSE chunks shaped like vLLM's, "
        f"{args.concurrency} at once, one fresh connection each, {args.rounds} rounds per "
        "client (alternating); CPU (user + system) of the client process per stream.",
        "",
        "| client | CPU ms per stream (median) | rounds |",
        "|---|---|---|",
        *(
            f"| {name} | {medians[name]:.2f} | "
            + ", ".join(f"{r['cpu_ms_per_stream']:.2f}" for r in rounds)
            + " |"
            for name, rounds in runs.items()
        ),
        "",
        f"aiohttp / httpx CPU per stream: {ratio:.2f} (VllmEngine uses aiohttp).",
    ]
    print("\n".join(lines))
    if not args.no_docs:
        write_docs_block("engine-http", "\n".join(lines))
    write_results(
        args.out,
        {
            "header": header,
            "args": vars(args) | {"out": str(args.out)},
            "runs": runs,
            "median_cpu_ms": medians,
            "ratio": ratio,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
