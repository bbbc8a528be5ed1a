"""What a run reports: the targets, the admission latency-throughput curve and the overhead table
as Markdown (printed, and the control-plane block of docs/benchmarks.md), each carried-over
section with the provenance of the run that measured it."""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common.tables import markdown_table
from benchmarks.control_plane.hops import HOPS
from benchmarks.report import DOCS_PATH, format_loads, header_lines, markers, write_docs_block

DOCS_BLOCK = "control-plane"
BEGIN, END = markers(DOCS_BLOCK)


def _fmt(value: object, column: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    return str(value)


ADMISSION_COLUMNS = (
    "setup", "mode", "offered_per_s", "achieved_per_s", "errors", "p50_ms", "p90_ms", "p99_ms",
    "max_ms", "service_p99_ms", "cpu_api_cores", "cpu_controller_agents_cores",
    "cpu_redis_cores", "cpu_clients_cores", "cpu_others_cores", "cpu_api_us_per_req",
    "cpu_redis_us_per_req",
)  # fmt: skip
OVERHEAD_COLUMNS = (
    "variant", "workload", "runs", "ok", "tokens_per_s", "makespan_s", "first_token_ms",
    "qlm_first_submit_ms", "baseline", "throughput_ratio", "ttft_p50_ms", "added_ttft_p50_ms",
    "ttft_p90_ms", "e2e_p50_ms", "qlm_admit_p50_ms", "qlm_dispatch_p50_ms",
    "qlm_engine_ttft_p50_ms", "qlm_delivery_p50_ms", "qlm_cpu_cores", "qlm_cpu_ms_per_req",
    "qlm_syscalls_per_req", "qlm_runq_wait_share", "vllm_cpu_cores", "vllm_steps",
    "prompt_tokens_mean",
)  # fmt: skip


def render(report: Mapping[str, Any]) -> str:
    parts = [
        "## Control plane: admission and overhead over vLLM",
        "",
        *header_lines(report),
        "",
        markdown_table(report["targets"], ("target", "subject", "measured", "result"), _fmt),
    ]
    admission = report.get("admission")
    if admission is not None:
        parts += [
            "",
            "### Admission: latency-throughput curve",
            "",
            *_measured_line(admission),
            ADMISSION_NOTE.format(**admission["options"]),
            "",
        ]
        parts.append(markdown_table(admission["rows"], ADMISSION_COLUMNS, _fmt))
        parts += ["", *admission_notes(admission["rows"])]
    overhead = report.get("overhead")
    if overhead is not None:
        workload = overhead["workloads"][-1]
        parts += [
            "",
            "### Overhead over a bare vLLM-CPU engine",
            "",
            *_measured_line(overhead),
            OVERHEAD_NOTE.format(
                rate=workload["rate_per_s"],
                cores=_cores(overhead.get("cores")),
                **overhead["workloads"][0],
            ),
            "",
        ]
        parts.append(markdown_table(overhead["summary"], OVERHEAD_COLUMNS, _fmt))
        parts += _hop_table(overhead.get("hops") or [])
    return "\n".join(parts)


def _hop_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    if not rows:
        return []
    columns = ("variant", "workload", "samples", "qlm_cpu_ms_per_req", *HOPS)
    return ["", "#### qlm CPU per streamed request, by hop (ms)", "", HOPS_NOTE, "",
            markdown_table(rows, columns, _fmt)]  # fmt: skip


def _measured_line(section: Mapping[str, Any]) -> list[str]:
    """Where a section was carried over from another run: that run's provenance."""
    m = section.get("measured")
    if not m:
        return []
    return [
        f"Measured by `{m['command']}` on {m['date']} (code {m['code']}; load average "
        f"{format_loads(m['loadavg_before'])} / {format_loads(m['loadavg_after'])}).",
        "",
    ]


def admission_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Data-driven lines under the curve: how much of the machine other users took, and
    the CPU one admission costs (closed-loop steps), which bounds what a core can admit."""
    measured = [r for r in rows if "error" not in r]
    if not measured:
        return []
    others = statistics.median(r["cpu_others_cores"] for r in measured)
    ours = statistics.median(r["cpu_machine_cores"] - r["cpu_others_cores"] for r in measured)
    lines = [
        f"Other processes on the machine used a median {others:.2f} of its "
        f"{os.cpu_count()} cores during these steps (this benchmark's processes: {ours:.2f})."
    ]
    for r in measured:
        if r.get("mode") == "closed" and r["setup"] in ("api x1", "api x2"):
            api_us, redis_us = r["cpu_api_us_per_req"], r["cpu_redis_us_per_req"]
            lines.append(
                f"`{r['setup']}` closed loop: {api_us:.0f} us of API CPU and {redis_us:.0f} us "
                f"of redis-server CPU per admission, i.e. about {1e6 / api_us:,.0f} admissions "
                "per second per API core (projection, not measured: the cores were shared)."
            )
    return [" ".join(lines)]


ADMISSION_NOTE = (
    "POST /v1/qlm/requests (batch work, 202) on a throwaway redis-server; each step restarts "
    "its setup on an emptied Redis and measures {duration_s:g} s after {warmup_s:g} s of "
    "warm-up. Setups: `api x1` one `qlm api` process; `api x2` two replicas sharing Redis "
    "(connections spread over both); `serve` `qlm serve` (API, control loop and the agents of "
    "examples/fleet.yaml's emulated fleet in one process); `split` two `qlm api` + `qlm "
    "controller` + `qlm agent`. Load: {clients} client processes (raw asyncio HTTP/1.1, "
    "keep-alive); open loop: Poisson arrivals at the offered rate over {connections} "
    "connections, latency from the scheduled send to the 202 (waiting for a connection "
    "counts); a setup's higher rates are skipped once two in a row fall below 80% of the "
    "offered rate; closed: {closed_connections} connections back to back (the setup's "
    "saturation rate); knee: open loop at 80% of that rate. CPU columns: cores used "
    "(CPU s per s) by the API process(es), controller + agents, redis-server, the load "
    "generator, and everything else on the machine (other users), measured over the step; "
    "us_per_req: CPU microseconds per accepted request (API process(es), redis-server)."
)
OVERHEAD_NOTE = (
    "{num_requests} streamed completions per run (~{prompt_words} prompt words, "
    "{output_tokens} output tokens, ignore_eos), all at once (`burst`) and as Poisson "
    "arrivals at {rate} req/s (`poisson`, half the first bare burst rate); tiny random Llama "
    "(tests/vllm_fixtures.py tiny-a) on vLLM-CPU, max_num_seqs 16. Cores: {cores}. "
    "`vLLM alone`: a vLLM "
    "server started as QLM's VllmEngine starts it (serve_argv), driven through its OpenAI "
    "API. `QLM memory` / `QLM redis`: `qlm serve` with one vLLM engine of the same settings "
    "(examples/fleet.yaml's QLM, controller and agent settings; in-memory queue or a "
    "throwaway redis-server), driven through QLM's API; `vLLM beside QLM ...`: that same "
    "vLLM server driven directly while QLM idles, in alternating turns with the QLM runs, "
    "and the baseline of the QLM rows (paired under the same machine load); `vLLM, client "
    "in flight <= 16 ...`: the same server driven by a client that keeps at most max_num_seqs "
    "streams open and sends the next the moment one ends (what holding work outside the "
    "engine costs with a refill that takes no time; its TTFT counts from the send, after the "
    "wait for a place). Throughput: "
    "output tokens over the makespan, median over runs; makespan_s (the run's first send to "
    "its last token), first_token_ms (its first send to its first token) and "
    "qlm_first_submit_ms (its first send to QLM's first submit into vLLM, from QLM's "
    "records): medians over runs; TTFT (to the first chunk with text) "
    "pooled over runs. From QLM's records: qlm_dispatch (admission to the agent's submit to "
    "vLLM) and qlm_engine_ttft (submit to the first token as the agent sees it). CPU in "
    "cores: the qlm process and the vLLM server's processes; qlm_syscalls_per_req: the qlm "
    "process's read and write system calls per request (/proc/PID/io; its round trips to "
    "Redis, vLLM and the clients: a count the machine's load does not blur, unlike its CPU; "
    "median over runs); qlm_runq_wait_share: share of "
    "the run's wall time the qlm event-loop thread spent runnable but waiting for a CPU. "
    "vllm_steps: the engine steps vLLM ran during the run (its `vllm:iteration_tokens_total` "
    "histogram's count), median over runs: every variant produces the same tokens, so more "
    "steps means steps that ran with free sequence slots."
)
HOPS_NOTE = (
    "Each QLM run's qlm CPU (the median over the runs py-spy sampled: as above unless it "
    "failed on some) split by where py-spy "
    "(--nonblocking, 250 samples/s, pooled over the runs) found the process: queue (any frame "
    "in qlm/queue/), token streaming (the SSE response: events to the client, socket writes "
    "included), admission (the rest of the HTTP server: parsing, validation, admission, wait "
    "estimate), control loop, agent, engine client (the vLLM adapter: submits, reading "
    "vLLM's token streams, metrics scrapes), other. Samples in uvloop's own C code (its wait "
    "is not told apart from its work) are spread in proportion: statistical shares "
    "(benchmarks/control_plane/hops.py)."
)


def _cores(cores: Mapping[str, Any] | None) -> str:
    if not cores or cores.get("vllm") is None:
        return "shared (no binding)"
    vllm = ",".join(map(str, cores["vllm"]))
    rest = ",".join(map(str, cores["qlm_and_clients"]))
    return (
        f"the vLLM server on core {vllm} (`cpu_cores`: process affinity and OpenMP binding), "
        f"QLM and the load generator on core {rest}"
    )


def write_docs(block: str, path: Path = DOCS_PATH) -> None:
    write_docs_block(DOCS_BLOCK, block, path)


def print_tables(report: Mapping[str, Any]) -> None:
    print(render(report))
