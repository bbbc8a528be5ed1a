"""Batch jobs beside interactive traffic, live (issue 15): sims/batch-mix.yaml on the embedded
control plane with emulated engines.

    .venv/bin/python -m benchmarks.batch_mix_live               # seed 1 (the scenario's)
    .venv/bin/python -m benchmarks.batch_mix_live --speedup 5 --seed 0

The scenario's requests (the same generator as the simulator's) go through the real API: the
interactive stream as streamed chat completions through the official openai client at the
scenario's arrival times, the 2,000-request job as one JSONL file through the Files and Batch
APIs (`metadata.qlm_deadline_s`: the job's 900 s window, `qlm_slo_class`: batch-job), with
texts that share the scenario's prefixes (one instruction block, 40 documents) so that the
API plans the job as a whole. Emulated engines (the packaged profiles, `output_length: cap`)
run `--speedup` times faster than the wall clock and every SLO target is scaled with them;
times below are engine seconds. The chats are sent from a process of their own; the plane
runs with the product's agent and controller defaults (examples/fleet.yaml's). A second run
sends the interactive stream alone. Reports the
job's requests done by its deadline, interactive p99 TTFT as the client saw it against the
interactive-only run, and attainment as the client and as the server saw it. Verdicts: >= 95 %
of the job on time, interactive p99 TTFT within 1.5x of the interactive-only run.

Writes benchmarks/results/batch_mix_live.json and the "batch-mix-live" block of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, NamedTuple

import openai

from benchmarks.common.stats import percentile
from benchmarks.common.tables import markdown_table
from benchmarks.report import (
    RESULTS_DIR,
    ROOT,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.config.serve_config import ServeConfig
from qlm.serve.runtime import Plane, running_plane
from qlm.sim.scenario import Scenario, load_scenario
from qlm.types import Request, RequestState

RESULTS_PATH = RESULTS_DIR / "batch_mix_live.json"
JOB_CLASS = "batch-job"
JOB_TARGET = 0.95
P99_RATIO_TARGET = 1.5


def serve_config(scenario: Scenario, speedup: float) -> ServeConfig:
    """The scenario's fleet and classes as a fleet file, every target `speedup` times
    shorter (the engines run that much faster)."""
    config = scenario.config.model_dump()
    for c in config["slo_classes"]:
        c["ttft_s"] /= speedup
        c["completion_s"] = None if c["completion_s"] is None else c["completion_s"] / speedup
    models = sorted({g.model for g in scenario.fleet_config.instances if g.model})
    return ServeConfig.model_validate({
        "qlm": config,
        "api": {"port": 0, "completion_timeout_s": 3600,
                "batch": {"max_file_bytes": 256 << 20, "poll_s": 0.2}},
        "engine": {"kind": "emulated", "speedup": speedup, "output_length": "cap",
                   "seed": scenario.seed},
        "models": [{"name": m, "max_context_tokens": 32_768} for m in models],
        "fleet": scenario.fleet_config.model_dump(by_alias=True, exclude_none=True),
    })  # fmt: skip


def words(tokens: int, tag: str) -> str:
    """About `tokens` tokens of text for the API's counter (4 ASCII characters a token)."""
    unit = f"{tag} "
    return (unit * (4 * tokens // len(unit) + 1))[: 4 * tokens]


def job_file(job: list[Request]) -> bytes:
    """The job as a Batch API input: each prompt its shared texts (one per distinct prefix
    the scenario gave it, so that equal prefixes are equal texts) and its own question."""
    shared: dict[tuple[int, ...], str] = {}
    lines = []
    for k, request in enumerate(job):
        own_tokens = request.prompt_tokens - sum(b.tokens for b in request.prefix)
        parts = []
        for depth in range(1, len(request.prefix) + 1):
            key = tuple(b.key for b in request.prefix[:depth])
            if key not in shared:
                shared[key] = words(request.prefix[depth - 1].tokens, f"s{len(shared)}")
            parts.append(shared[key])
        body = {"model": request.model, "prompt": "".join(parts) + words(own_tokens, f"q{k}"),
                "max_tokens": request.max_output_tokens}  # fmt: skip
        line = {"custom_id": f"q{k}", "method": "POST", "url": "/v1/completions", "body": body}
        lines.append(json.dumps(line))
    return ("\n".join(lines) + "\n").encode()


class ChatAnswer(NamedTuple):
    """One chat as its client saw it: the request id, TTFT (engine s), and when it was sent
    and its first text arrived (wall clock, comparable with the plane's stamps: one machine)."""

    request_id: str
    ttft_s: float | None
    sent_at_s: float
    first_at_s: float | None


async def chat(
    client: openai.AsyncOpenAI, request: Request, delay_s: float, speedup: float
) -> ChatAnswer:
    """One interactive request at its arrival."""
    await asyncio.sleep(delay_s)
    loop = asyncio.get_running_loop()
    start, sent_at_s = loop.time(), time.time()
    first, first_at_s, rid = None, None, ""
    try:
        stream = await client.chat.completions.create(
            model=request.model,
            messages=[{"role": "user", "content": words(request.prompt_tokens, "chat")}],
            max_tokens=request.max_output_tokens,
            stream=True,
            extra_headers={"x-qlm-slo-class": request.slo_class},
        )
        async for chunk in stream:
            rid = chunk.id
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first, first_at_s = (loop.time() - start) * speedup, time.time()
    except openai.APIError as exc:  # counted as a miss, and reported
        print(f"chat at {request.arrival_at_s:.1f} s failed: {exc!r}", file=sys.stderr)
    return ChatAnswer(rid, first, sent_at_s, first_at_s)


def client_for(base: str) -> openai.AsyncOpenAI:
    # the official client's default retries (a pooled connection the server closed while
    # idle fails its next request at once; a real client retries it)
    return openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=2, timeout=3600)


def send_chats(base: str, chats: list[Request], start_s: float, speedup: float) -> list[ChatAnswer]:
    """The interactive stream, from a process of its own (a client's CPU is not the
    plane's: in the plane's event loop, parsing 2,000 streams delayed the plane itself)."""

    async def send() -> list[ChatAnswer]:
        client = client_for(base)
        answers = await asyncio.gather(*(
            chat(client, r, (r.arrival_at_s - start_s) / speedup, speedup) for r in chats
        ))  # fmt: skip
        await client.close()
        return list(answers)

    return asyncio.run(send())


async def run_live(scenario: Scenario, seed: int, speedup: float, with_job: bool) -> dict[str, Any]:
    requests = scenario.requests(seed)
    job = [r for r in requests if r.slo_class == JOB_CLASS]
    chats = [r for r in requests if r.slo_class != JOB_CLASS]
    config = serve_config(scenario, speedup)
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        await loop.run_in_executor(pool, percentile, [0.0], 0.5)  # the client process is up
        async with running_plane(config) as plane:
            base = f"http://127.0.0.1:{plane.port}/v1"
            client = client_for(base)
            await asyncio.sleep(1.0)  # the first plan and the agents' first reports
            batch_id = await submit_job(client, job, speedup) if with_job else None
            start_s = min(r.arrival_at_s for r in requests)
            answers = await loop.run_in_executor(pool, send_chats, base, chats, start_s, speedup)
            job_rows = await finish_job(client, plane, batch_id, len(job), speedup)
            interactive = await interactive_rows(plane, answers, scenario, speedup)
            await client.close()
    return {**job_rows, **interactive}


async def submit_job(client: openai.AsyncOpenAI, job: list[Request], speedup: float) -> str:
    window_s = max(r.completion_deadline_at_s or r.ttft_deadline_at_s for r in job)
    upload = await client.files.create(file=("job.jsonl", job_file(job)), purpose="batch")
    metadata = {"qlm_deadline_s": f"{window_s / speedup:.3f}", "qlm_slo_class": JOB_CLASS}
    batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/completions",
                                        completion_window="24h", metadata=metadata)  # fmt: skip
    return batch.id


async def finish_job(
    client: openai.AsyncOpenAI, plane: Plane, batch_id: str | None, lines: int, speedup: float
) -> dict[str, Any]:
    if batch_id is None:
        return {}
    while (batch := await client.batches.retrieve(batch_id)).status not in (
        "completed", "expired", "failed", "cancelled"
    ):  # fmt: skip
        await asyncio.sleep(0.5)
    records = [await plane.queue.get(f"{batch_id}-{k + 1}") for k in range(lines)]
    done = [r for r in records if r is not None and r.state is RequestState.COMPLETED]
    ends = [r.result.finished_at_s for r in done if r.result and r.result.finished_at_s]
    on_time = sum(
        bool(r.result and r.result.finished_at_s is not None
             and r.result.finished_at_s <= (r.request.completion_deadline_at_s or 0.0))
        for r in done
    )  # fmt: skip
    start_s = min((r.request.arrival_at_s for r in done), default=0.0)
    span_s = (max(ends) - start_s) * speedup if ends else None
    return {
        "job status": batch.status,
        "job on time": on_time / lines,
        "job done": len(done) / lines,
        "job rps": len(done) / span_s if span_s else None,
    }


async def interactive_rows(
    plane: Plane, answers: list[ChatAnswer], scenario: Scenario, speedup: float
) -> dict[str, Any]:
    """Attainment at the client and at the server, and where the p99 went (engine s): client
    to the API's arrival stamp, the queue, the engine to its first token, and the first
    token's way back to the client."""
    target_s = next(c.ttft_s for c in scenario.slo_classes if c.name != JOB_CLASS)
    ttfts = [a.ttft_s for a in answers if a.ttft_s is not None]
    server_met = 0
    hops: dict[str, list[float]] = {"to api": [], "queued": [], "engine": [], "back": []}
    for answer in answers:
        record = await plane.queue.get(answer.request_id) if answer.request_id else None
        result = None if record is None else record.result
        first_s = None if result is None else result.first_token_at_s
        if record is None or result is None or first_s is None:
            continue
        server_met += first_s <= record.request.ttft_deadline_at_s
        hops["to api"].append((record.request.arrival_at_s - answer.sent_at_s) * speedup)
        if answer.first_at_s is not None:
            hops["back"].append((answer.first_at_s - first_s) * speedup)
        if result.dispatched_at_s is not None:
            hops["queued"].append((result.dispatched_at_s - record.request.arrival_at_s) * speedup)
            hops["engine"].append((first_s - result.dispatched_at_s) * speedup)
    return {
        "interactive": len(answers),
        "failed": sum(not a.request_id for a in answers),
        "attainment (client)": sum(t <= target_s for t in ttfts) / len(answers),
        "attainment (server)": server_met / len(answers),
        "p99 ttft_s (client)": percentile(ttfts, 0.99),
        **{f"p99 {hop}_s": percentile(values, 0.99) for hop, values in hops.items()},
    }


def verdict(mixed: dict[str, Any], alone: dict[str, Any]) -> dict[str, Any]:
    p99, p99_alone = mixed["p99 ttft_s (client)"], alone["p99 ttft_s (client)"]
    ratio = None if p99 is None or not p99_alone else p99 / p99_alone
    return {
        "job on time": mixed["job on time"],
        f">= {JOB_TARGET:.0%}": "PASS" if mixed["job on time"] >= JOB_TARGET else "MISS",
        "interactive p99 / alone": ratio,
        f"<= {P99_RATIO_TARGET}x": "PASS" if ratio is not None and ratio <= P99_RATIO_TARGET
        else "MISS",
    }  # fmt: skip


def fmt(value: object, column: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if "on time" in column or "done" in column or "attainment" in column:
            return f"{100 * value:.1f}%"
        return f"{value:.2f}"
    return str(value)


def render(report: dict[str, Any]) -> str:
    rows = [{"run": "job + interactive", **report["mixed"]},
            {"run": "interactive alone", **report["alone"]}]  # fmt: skip
    columns = list(dict.fromkeys(k for row in rows for k in row))
    judged = verdict(report["mixed"], report["alone"])
    return "\n".join([
        "## Batch jobs beside interactive traffic (live, emulated engines)",
        "",
        "sims/batch-mix.yaml's requests through the real API (qlm only: the live plane runs "
        "qlm's policy; the simulator block above has llmd and fcfs): the job as a Batch API "
        "file with its 900 s deadline, the chats as streamed chat completions at their arrival "
        f"times. Emulated engines at {report['speedup']}x the wall clock, SLO targets scaled "
        "alike; times in engine seconds. Seed "
        f"{report['seed']}. Client TTFT is measured at the openai client, which runs in a "
        "process of its own; the plane (API, controller, agents, engines) in another, with "
        "the product's default agent and controller settings. Where a chat's time went, p99 "
        "of each hop (one machine, one wall clock): `to api` from the client's send to the "
        "API's arrival stamp, `queued` to the agent's submit, `engine` to the first token, "
        "`back` from there to the client's first chunk.",
        "",
        *header_lines(report["header"]),
        "",
        markdown_table([judged], list(judged), fmt),
        "",
        markdown_table(rows, columns, fmt),
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--speedup", type=float, default=5.0)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    header = run_header("batch_mix_live.py", sys.argv[1:] if argv is None else argv, "shared")
    scenario = load_scenario(ROOT / "sims" / "batch-mix.yaml")
    mixed = asyncio.run(run_live(scenario, args.seed, args.speedup, with_job=True))
    alone = asyncio.run(run_live(scenario, args.seed, args.speedup, with_job=False))
    finish_header(header)
    report = {"header": header, "seed": args.seed, "speedup": args.speedup,
              "mixed": mixed, "alone": alone}  # fmt: skip
    block = render(report)
    print(block)
    if not args.no_docs:
        write_results(RESULTS_PATH, report)
        write_docs_block("batch-mix-live", block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
