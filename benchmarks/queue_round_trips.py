"""What the global queue costs a streamed request in the live plane: the plane's system calls
(its round trips to Redis and to its clients), its CPU and the Redis server's, per request,
with the in-memory queue and with Redis, and optionally against an earlier commit, paired.

    .venv/bin/python -m benchmarks.queue_round_trips                       # this checkout
    .venv/bin/python -m benchmarks.queue_round_trips --compare-with 3594225 --no-docs

Each run starts `qlm serve` (one emulated instance following a small profile on the wall
clock, so no vLLM is needed and the engine's own cost is the same in every run) on the in-memory
queue or on a throwaway redis-server, warms it with the workload once, then sends `--requests`
streamed chat completions with the official openai client at Poisson arrivals of `--rate` per
second and counts, over those requests: the qlm process's read and write system calls
(/proc/PID/io: a figure the machine's load does not blur) and CPU (per-thread schedstat), the
redis-server's CPU and the commands it ran (INFO commandstats, scripts' inner commands
included). With `--compare-with REV` every run is made twice, once from a git worktree of REV,
the two taking turns (order alternating per round) so that they share the machine's
conditions; the median over rounds is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import openai
import redis
import yaml

from benchmarks.common.plane import QLM_MAIN, Proc, stop, wait_http
from benchmarks.control_plane.cpu import process_cpu_s, process_syscalls
from benchmarks.report import (
    RESULTS_DIR,
    ROOT,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from tests.redis_server import RedisServer, free_port

PROFILE = {
    "model": "tiny",
    "gpu_type": "cpu",
    "weight_bytes": 10737418,
    "kv_bytes_per_token": 1024,
    "decode_table": {"batch_sizes": [1, 16], "step_s": [0.008, 0.02]},
    "prefill_tokens_per_s": 20000,
    "output_tokens_mean": 32,
    "output_tokens_std": 1,
    "load_s": 30,
    "max_batch_size": 16,
}


def plane_config(path: Path, redis_url: str | None) -> Path:
    data = {
        "qlm": {
            "slo_classes": [{"name": "interactive", "ttft_s": 2.0}],
            "default_slo_class": "interactive",
        },
        "queue": {"url": redis_url, "key_prefix": "bench:"},
        "api": {"host": "127.0.0.1", "port": 0},
        "engine": {"kind": "emulated", "speedup": 1.0, "seed": 0},
        "models": [{"name": "tiny", "max_context_tokens": 4096}],
        "fleet": {
            "gpu_types": {"cpu": {"memory_gib": 1.0}},
            "packaged_profiles": False,
            "instances": [{"id": "cpu", "gpu_type": "cpu", "model": "tiny"}],
            "profiles": [PROFILE],
        },
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start_plane(root: Path, config: Path, work: Path) -> Proc:
    """`qlm serve` from the checkout at `root` (this one, or a worktree of an earlier commit)."""
    port = free_port()
    argv = [sys.executable, "-c", QLM_MAIN, "serve", "--config", str(config), "--port", str(port)]
    log_path = work / f"serve-{port}.log"
    env = {**os.environ, "PYTHONPATH": str(root)}
    with log_path.open("wb") as log:
        popen = subprocess.Popen(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc = Proc("serve", popen, log_path, port)
    wait_http(proc, "/readyz", 120.0)
    return proc


async def send(url: str, count: int, rate_per_s: float, seed: int) -> int:
    """`count` streamed chats at Poisson arrivals; the chunks the clients received."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    rng = random.Random(seed)

    async def one() -> int:
        stream = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "tell me about queues " * 8}],
            max_tokens=32,
            stream=True,
        )
        return sum([1 async for _ in stream])

    tasks = []
    for _ in range(count):
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(rng.expovariate(rate_per_s))
    chunks = sum(await asyncio.gather(*tasks))
    await client.close()
    return chunks


def redis_counters(server: RedisServer | None) -> tuple[float, int]:
    """The redis-server's CPU seconds and the commands it has run (0, 0 without one)."""
    if server is None:
        return 0.0, 0
    client = redis.Redis.from_url(server.url)
    try:
        stats = client.info("commandstats")
        commands = sum(int(v["calls"]) for v in stats.values())
        cpu = client.info("cpu")
        return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), commands
    finally:
        client.close()


def one_run(root: Path, queue: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(RedisServer()) if queue == "redis" else None
        config = plane_config(work / f"plane-{queue}.yaml", server.url if server else None)
        proc = start_plane(root, config, work)
        stack.callback(stop, proc, 30.0)
        url = f"http://127.0.0.1:{proc.port}"
        asyncio.run(send(url, args.requests, args.rate, seed=1))  # warm-up
        pid = proc.popen.pid
        cpu0, calls0, (rcpu0, rcmd0) = (
            process_cpu_s(pid),
            process_syscalls(pid),
            redis_counters(server),
        )
        chunks = asyncio.run(send(url, args.requests, args.rate, seed=0))
        cpu1, calls1, (rcpu1, rcmd1) = (
            process_cpu_s(pid),
            process_syscalls(pid),
            redis_counters(server),
        )
    n = args.requests
    return {
        "chunks_per_req": chunks / n,
        "qlm_syscalls_per_req": (calls1 - calls0) / n,
        "qlm_cpu_ms_per_req": 1e3 * (cpu1 - cpu0) / n,
        "redis_cpu_ms_per_req": 1e3 * (rcpu1 - rcpu0) / n,
        "redis_commands_per_req": (rcmd1 - rcmd0) / n,
    }


@contextlib.contextmanager
def worktree(rev: str | None) -> Iterator[Path | None]:
    """A detached git worktree of `rev` for the run's duration (None: no comparison)."""
    if rev is None:
        yield None
        return
    path = Path(tempfile.mkdtemp(prefix="qlm-rt-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT, check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


METRICS = (
    "qlm_syscalls_per_req",
    "qlm_cpu_ms_per_req",
    "redis_cpu_ms_per_req",
    "redis_commands_per_req",
    "chunks_per_req",
)


def table(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "| code | queue | " + " | ".join(METRICS) + " | rounds (syscalls) |",
        "|---|---|" + "---|" * len(METRICS) + "---|",
    ]
    for key, rs in runs.items():
        code, queue = key.split(" / ")
        medians = [statistics.median(r[m] for r in rs) for m in METRICS]
        rounds = ", ".join(f"{r['qlm_syscalls_per_req']:.1f}" for r in rs)
        lines.append(
            f"| {code} | {queue} | " + " | ".join(f"{v:.2f}" for v in medians) + f" | {rounds} |"
        )
    return lines


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0, help="arrivals per second")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--queues", nargs="+", default=["memory", "redis"])
    parser.add_argument("--compare-with", metavar="REV", help="also run this git revision")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "queue_round_trips.json")
    parser.add_argument("--no-docs", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    header = run_header("queue_round_trips.py", argv, "shared")
    runs: dict[str, list[dict[str, Any]]] = {}
    with worktree(args.compare_with) as other, tempfile.TemporaryDirectory() as tmp:
        codes = [("this checkout", ROOT)] + ([(args.compare_with, other)] if other else [])
        for k in range(args.rounds):
            for label, root in codes if k % 2 == 0 else codes[::-1]:
                for queue in args.queues:
                    got = one_run(root, queue, args, Path(tmp))
                    runs.setdefault(f"{label} / {queue}", []).append(got)
                    print(f"  {label} / {queue}: {got}", file=sys.stderr)
    finish_header(header)
    lines = [
        "## Queue round trips: what the global queue costs a streamed request",
        "",
        *header_lines(header),
        "",
        f"One emulated instance behind `qlm serve`; {args.requests} streamed chat completions "
        f"(32 tokens) with the openai client at Poisson arrivals of {args.rate:g}/s after one "
        "warm-up pass; per request: the qlm process's system calls and CPU, the redis-server's "
        f"CPU and commands (scripts' inner ones included). Medians of {args.rounds} rounds"
        + (", the two codes taking turns." if args.compare_with else "."),
        "",
        *table(runs),
    ]
    print("\n".join(lines))
    if not args.no_docs:
        write_docs_block("queue-round-trips", "\n".join(lines))
    plain = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    write_results(args.out, {"header": header, "args": plain, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
