"""Client-side latency benchmark: what clients feel against what QLM reports.

`qlm serve` (examples/fleet.yaml's QLM, controller and agent settings; its emulated fleet at
`--speedup`, in-memory queue) takes a mix at a fixed offered rate, as Poisson arrivals: a
quarter streamed interactive completions, three quarters asynchronous batch submissions
(202). The load generator (this process, asyncio + httpx) measures each request from its
scheduled send, so a request waiting for a connection or for the server counts. For the
interactive requests, QLM's own records give the server-side view (arrival stamp to first
token); the table sets client-side against server-side time to first token and attainment.

    .venv/bin/python -m benchmarks.client_latency                 # 150 and 300 req/s
    .venv/bin/python -m benchmarks.client_latency --rates 300 --requests 2000
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.common.plane import example_fleet, start_qlm, stop, wait_http
from benchmarks.common.stats import percentile
from benchmarks.common.tables import markdown_table, target_row
from benchmarks.control_plane.streams import StreamSample, prompt_text, stream_one
from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from tests.redis_server import free_port

RESULTS_PATH = RESULTS_DIR / "client_latency.json"
DOCS_BLOCK = "client-latency"
MODEL = "mistral-7b"
INTERACTIVE_SHARE = 0.25
NOTE = "the load generator shares the machine's 2 cores with `qlm serve`"


def plane_config(path: Path, speedup: float) -> Path:
    fleet = example_fleet()
    fleet["engine"] = {**fleet["engine"], "speedup": speedup, "output_length": "cap"}
    fleet["api"] = {"host": "127.0.0.1", "port": 0}
    path.write_text(yaml.safe_dump(fleet, sort_keys=False))
    return path


async def submit_one(client: httpx.AsyncClient, index: int, at: float) -> float | None:
    """Milliseconds from the scheduled send to the 202; None on any other answer."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    body: dict[str, Any] = {"kind": "completion", "model": MODEL, "max_tokens": 64}
    body |= {"prompt": prompt_text(index, 20), "slo_class": "batch-2"}
    try:
        response = await client.post("/v1/qlm/requests", json=body)
    except httpx.HTTPError:
        return None
    return 1e3 * (time.monotonic() - at) if response.status_code == 202 else None


async def run_rate(base_url: str, rate: float, count: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    start = time.monotonic() + 0.5
    at, kinds = [], []
    for _ in range(count):
        start += rng.expovariate(rate)
        at.append(start)
        kinds.append(rng.random() < INTERACTIVE_SHARE)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=120.0, trust_env=False
    ) as client:
        jobs = [
            stream_one(client, "/v1/completions", _interactive(i), t)
            if interactive
            else submit_one(client, i, t)
            for i, (t, interactive) in enumerate(zip(at, kinds, strict=True))
        ]
        results = await asyncio.gather(*jobs)
        streams = [r for r in results if isinstance(r, StreamSample)]
        enqueues = [r for r in results if not isinstance(r, StreamSample)]
        server = await _server_ttft(client, streams)
    return summarise(rate, at[-1] - at[0], streams, enqueues, server)


def _interactive(index: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": prompt_text(index, 20),
        "max_tokens": 16,
        "stream": True,
        "slo_class": "interactive",
    }


async def _server_ttft(client: httpx.AsyncClient, streams: list[StreamSample]) -> list[float]:
    """Arrival stamp to first token, from QLM's records (ms), for the streams that got one."""
    out = []
    for sample in streams:
        if sample.request_id is None:
            continue
        times = (await client.get(f"/v1/qlm/requests/{sample.request_id}")).json()["times"]
        if times.get("first_token_at_s") is not None:
            out.append(1e3 * (times["first_token_at_s"] - times["arrival_at_s"]))
    return out


def summarise(
    rate: float,
    span_s: float,
    streams: list[StreamSample],
    enqueues: list[float | None],
    server_ms: list[float],
) -> dict[str, Any]:
    target_ms = 1e3 * _interactive_target_s()
    client_ms = [1e3 * (s.first - s.sent) for s in streams if s.first is not None]
    accepted = [e for e in enqueues if e is not None]
    return {
        "offered_per_s": rate,
        "requests": len(streams) + len(enqueues),
        "offered_span_s": span_s,
        "interactive": len(streams),
        "interactive_ok": len(client_ms),
        "client_ttft_p50_ms": percentile(client_ms, 0.5),
        "client_ttft_p99_ms": percentile(client_ms, 0.99),
        "server_ttft_p50_ms": percentile(server_ms, 0.5),
        "server_ttft_p99_ms": percentile(server_ms, 0.99),
        "client_attainment": _share(client_ms, target_ms, len(streams)),
        "server_attainment": _share(server_ms, target_ms, len(streams)),
        "enqueue_p50_ms": percentile(accepted, 0.5),
        "enqueue_p99_ms": percentile(accepted, 0.99),
        "enqueue_errors": len(enqueues) - len(accepted),
    }


def _share(values_ms: list[float], target_ms: float, total: int) -> float | None:
    return None if not total else sum(v <= target_ms for v in values_ms) / total


def _interactive_target_s() -> float:
    classes = example_fleet()["qlm"]["slo_classes"]
    return float(next(c["ttft_s"] for c in classes if c["name"] == "interactive"))


def render(report: dict[str, Any]) -> str:
    rows = report["rows"]
    target_s = _interactive_target_s()
    checks = []
    for row in rows:
        p99 = row["client_ttft_p99_ms"]
        gap = _gap(row)
        subject = f"{row['offered_per_s']:g} req/s"
        checks.append(
            target_row("client TTFT p99 <= 1 s", subject, _ms(p99), p99 is not None and p99 <= 1e3)
        )
        measured = "-" if gap is None else f"{100 * gap:.1f} points"
        checks.append(
            target_row(
                "client and server attainment within 1 point",
                subject,
                measured,
                gap is not None and gap <= 0.01,
            )
        )
    columns = list(rows[0]) if rows else []
    return "\n".join(
        [
            "## Client-side latency: what clients feel against what QLM reports",
            "",
            *header_lines(report),
            "",
            markdown_table(checks, ["target", "subject", "measured", "result"], _cell),
            "",
            f"`qlm serve` with examples/fleet.yaml's settings and emulated fleet at speedup "
            f"{report['speedup']:g}; Poisson arrivals at the offered rate, a quarter streamed "
            f"interactive completions (16 tokens, TTFT target {target_s:g} s), the rest "
            "asynchronous batch submissions (202). Client times run from the scheduled send; "
            "server times from QLM's arrival stamp (taken when the request reaches the app) "
            f"to the first token. Attainment: the share of interactive requests whose first "
            f"token came within the target, by each clock. Note: {NOTE}.",
            "",
            markdown_table(rows, columns, _cell),
        ]
    )


def _gap(row: dict[str, Any]) -> float | None:
    client, server = row["client_attainment"], row["server_attainment"]
    return None if client is None or server is None else abs(client - server)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _cell(value: object, column: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{100 * value:.1f}%" if column.endswith("attainment") else f"{value:,.1f}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[150.0, 300.0])
    parser.add_argument("--requests", type=int, default=2000, help="per rate")
    parser.add_argument("--speedup", type=float, default=20.0, help="emulated engines")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    report: dict[str, Any] = run_header("client_latency.py", argv or sys.argv[1:], NOTE)
    report["speedup"] = args.speedup
    report["rows"] = []
    with tempfile.TemporaryDirectory(prefix="qlm-client-latency-") as tmp:
        work = Path(tmp)
        for rate in args.rates:
            config = plane_config(work / f"fleet-{rate:g}.yaml", args.speedup)
            proc = start_qlm(["serve"], config, work, free_port())
            try:
                wait_http(proc, "/readyz", 120.0)
                row = asyncio.run(
                    run_rate(f"http://127.0.0.1:{proc.port}", rate, args.requests, args.seed)
                )
            finally:
                stop(proc, grace_s=20.0)
            print(row, file=sys.stderr)
            report["rows"].append(row)
    finish_header(report)
    write_results(RESULTS_PATH, report)
    text = render(report)
    print(text)
    if not args.no_docs:
        write_docs_block(DOCS_BLOCK, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
