"""GlobalQueue benchmark: throughput and per-call latency of the hot operations, for the memory
and the Redis queue, at several client concurrencies.

For each implementation and concurrency C, N requests are enqueued by C concurrent tasks, then
pulled one per call (an agent's smallest pull) by C tasks, then completed by C tasks; last, the
control loop's snapshot (`queued()` of N requests) is timed. The Redis queue runs against a
throwaway redis-server on a free port (tests/redis_server.py) unless --redis-url is given; on
this machine client and server share the same cores.

    .venv/bin/python -m benchmarks.queue_ops          # table + results/queue_ops.json
    .venv/bin/python -m benchmarks.queue_ops --requests 2000 --concurrency 1 8
    .venv/bin/python -m benchmarks.queue_ops --replicated --requests 5000

--replicated measures what acknowledged writes cost instead: a primary with one replica
attached, the queue without (`replicas_to_ack: 0`) and with (`1`: each enqueue, pull and
complete waits for the replica, Redis WAIT) on the same pair of servers; results in
results/queue_replicas.json and the queue-replicas block of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.queue.factory import make_queue
from qlm.queue.queue_protocol import GlobalQueue
from qlm.queue.records import RequestResult
from qlm.types import DEFAULT_SLO_CLASSES, Request, RequestState
from tests.redis_sentinel import ReplicaServer
from tests.redis_server import RedisServer

RESULTS_PATH = RESULTS_DIR / "queue_ops.json"
REPLICAS_PATH = RESULTS_DIR / "queue_replicas.json"
Op = Callable[[str], Awaitable[object]]


def make_requests(num_requests: int, run: str) -> list[Request]:
    slo = DEFAULT_SLO_CLASSES[0]
    return [
        Request.create(f"{run}-{i}", "llama-8b", 500 + i % 700, 256, slo, arrival_at_s=i * 1e-3)
        for i in range(num_requests)
    ]


async def timed(ids: list[str], concurrency: int, op: Op) -> dict[str, float]:
    """Runs op over ids with `concurrency` tasks; throughput and latency percentiles."""
    latencies_s: list[float] = []
    source: Iterator[str] = iter(ids)

    async def worker() -> None:
        for rid in source:  # tasks share one iterator: each id is used once
            start = time.perf_counter()
            await op(rid)
            latencies_s.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed_s = time.perf_counter() - start
    latencies_s.sort()
    return {
        "ops_per_s": len(ids) / elapsed_s,
        "p50_ms": 1e3 * statistics.median(latencies_s),
        "p99_ms": 1e3 * latencies_s[int(0.99 * (len(latencies_s) - 1))],
    }


async def measure(
    queue: GlobalQueue, num_requests: int, concurrency: int, run: str
) -> list[dict[str, Any]]:
    requests = make_requests(num_requests, run)
    by_id = {r.id: r for r in requests}
    ids = list(by_id)
    rows: list[dict[str, Any]] = []

    async def pull(rid: str) -> None:
        assert await queue.pull("i0", [rid], lease_s=60.0, now_s=1.0), rid

    async def complete(rid: str) -> None:
        assert await queue.complete(RequestResult(rid, RequestState.COMPLETED, "i0")), rid

    for name, op in (
        ("enqueue", lambda rid: queue.enqueue(by_id[rid])),
        ("pull", pull),
        ("complete", complete),
    ):
        rows.append({"op": name, "concurrency": concurrency, **await timed(ids, concurrency, op)})
    return rows


async def snapshot_ms(queue: GlobalQueue, num_requests: int, run: str) -> float:
    for request in make_requests(num_requests, run):
        await queue.enqueue(request)
    start = time.perf_counter()
    snapshot = await queue.queued()
    elapsed_ms = 1e3 * (time.perf_counter() - start)
    assert len(snapshot) == num_requests
    return elapsed_ms


async def bench(name: str, url: str, args: argparse.Namespace, **more: Any) -> list[dict[str, Any]]:
    options = {"key_prefix": f"bench:{name}:", **more} if url.startswith("redis") else {}
    rows: list[dict[str, Any]] = []
    for concurrency in args.concurrency:
        queue = make_queue(url, **options, **_unbounded(url))
        for row in await measure(queue, args.requests, concurrency, f"c{concurrency}"):
            rows.append({"queue": name, **row})
        await queue.close()
    queue = make_queue(url, **options, **_unbounded(url))
    rows.append(
        {
            "queue": name,
            "op": f"queued() of {args.requests}",
            "concurrency": 1,
            "p50_ms": await snapshot_ms(queue, args.requests, "snap"),
        }
    )
    await queue.close()
    return rows


def _unbounded(url: str) -> dict[str, Any]:
    return {} if url.startswith("redis") else {"max_finished_records": None}


def print_table(rows: list[dict[str, Any]]) -> None:
    header = f"{'queue':<7} {'op':<22} {'conc':>4} {'ops/s':>10} {'p50 ms':>8} {'p99 ms':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        ops = f"{r['ops_per_s']:>10.0f}" if "ops_per_s" in r else f"{'':>10}"
        p99 = f"{r['p99_ms']:>8.3f}" if "p99_ms" in r else f"{'':>8}"
        print(
            f"{r['queue']:<7} {r['op']:<22} {r['concurrency']:>4} {ops} {r['p50_ms']:>8.3f} {p99}"
        )


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = await bench("memory", "memory://", args)
    if args.redis_url:
        return rows + await bench("redis", args.redis_url, args)
    with RedisServer() as server:
        return rows + await bench("redis", server.url, args)


async def replicated(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The same operations on a primary with one replica attached, without and with WAIT 1."""
    with RedisServer() as primary, ReplicaServer(primary.port) as replica:
        replica.wait_linked()
        rows = await bench("ack-0", primary.url, args)
        return rows + await bench("ack-1", primary.url, args, replicas_to_ack=1)


def replicas_block(report: dict[str, Any]) -> str:
    """The docs block: each operation's latency and throughput without and with WAIT 1."""
    rows = {(r["queue"], r["op"], r["concurrency"]): r for r in report["rows"]}
    lines = ["## Acknowledged writes: the cost of waiting for a replica", "", *header_lines(report)]
    lines += [
        "",
        "| op | concurrency | p50 ms, primary / +replica | p99 ms, primary / +replica "
        "| ops/s, primary / +replica |",
        "|---|---|---|---|---|",
    ]
    for (queue, op, conc), plain in rows.items():
        acked = rows.get(("ack-1", op, conc))
        if queue != "ack-0" or acked is None or "ops_per_s" not in plain:
            continue
        lines.append(
            f"| {op} | {conc} | {plain['p50_ms']:.3f} / {acked['p50_ms']:.3f} "
            f"| {plain['p99_ms']:.3f} / {acked['p99_ms']:.3f} "
            f"| {plain['ops_per_s']:.0f} / {acked['ops_per_s']:.0f} |"
        )
    lines += [
        "",
        "primary: `replicas_to_ack: 0` (the primary's answer counts); +replica: `1` (each "
        "enqueue, pull and complete pipeline ends with WAIT 1, so a replica holds it before "
        "it counts). Same primary and replica (one attached in both runs), client, servers and "
        "replica on this machine's 2 cores.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--redis-url", default=None, help="use this Redis (keys under bench:)")
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    parser.add_argument(
        "--replicated", action="store_true", help="WAIT 1 against no wait, with a replica"
    )
    args = parser.parse_args()
    if args.replicated:
        report = run_header("queue_ops.py", sys.argv[1:], "redis-server and one replica, local")
        report["rows"] = asyncio.run(replicated(args))
        finish_header(report)
        print_table(report["rows"])
        write_results(REPLICAS_PATH, report)
        write_docs_block("queue-replicas", replicas_block(report))
        print(f"wrote {REPLICAS_PATH} and the queue-replicas block of docs/benchmarks.md")
        return
    rows = asyncio.run(main_async(args))
    print_table(rows)
    meta = {"requests": args.requests, "machine": platform.platform(), "cpus": os.cpu_count()}
    write_results(args.out, {"meta": meta, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
