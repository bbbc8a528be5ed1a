"""One point of the programs benchmark: a stream of one application's instances against the live
plane (embedded, emulated engines on the packaged A100 profile, sped up), either as programs
(one POST, then one waiting read of the result) or call by call (each call a completion sent
once its inputs came back to the client), every client exchange paying a round trip."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from benchmarks.common.stats import percentile
from benchmarks.programs.apps import APPS, App, documents
from qlm.config.serve_config import ServeConfig
from qlm.programs.deadlines import CallTime, critical_path_s
from qlm.programs.graph import ProgramCall, ProgramGraph, render
from qlm.serve.runtime import running_plane

MODEL = "mistral-7b"
PROGRAMS = "/v1/qlm/programs"
Finished = tuple[float, float, bool, float]  # latency, deadline, completed, latency alone


@dataclass(frozen=True, slots=True)
class Setup:
    apps: int  # instances of the application per point
    rate_per_s: float | None  # their Poisson arrival rate (model time); None: one at a time
    rtt_s: float  # one client round trip (model time)
    speedup: float  # engines run this much faster than the wall clock
    deadline_factor: float  # an app's deadline: this times its critical path alone
    instances: int
    seed: int


def plane_config(setup: Setup) -> ServeConfig:
    return ServeConfig.model_validate({
        "qlm": {
            "slo_classes": [
                {"name": "interactive", "ttft_s": 30.0 / setup.speedup, "priority": 1,
                 "lateness_weight": 10},
                {"name": "batch-2", "ttft_s": 3600.0, "priority": 0, "lateness_weight": 1},
            ],
            "default_slo_class": "interactive",
            "planner": {"policy": "milp", "time_limit_s": 0.3},
            "control": {"tick_s": 0.2},
        },
        "api": {"port": 0, "completion_timeout_s": 3600},
        "agent": {"poll_s": 0.05},
        "engine": {"kind": "emulated", "speedup": setup.speedup, "output_length": "cap"},
        "models": [{"name": MODEL, "max_context_tokens": 16_384}],
        "fleet": {"instances": [{"id": "a100", "gpu_type": "A100", "model": MODEL,
                                 "count": setup.instances}]},
    })  # fmt: skip


def specs(app: App) -> tuple[ProgramCall, ...]:
    return tuple(
        ProgramCall(c["name"], c["model"], c["prompt"], c.get("max_tokens", 256))
        for c in app.program.calls
    )


def call_times(
    app: App, config: ServeConfig
) -> tuple[ProgramGraph, dict[str, int], dict[str, CallTime]]:
    """The app's graph, each call's prompt tokens (its inputs' and its used calls' output
    caps filled in) and its time alone by the profile (engine seconds)."""
    fleet = config.fleet()
    profile = fleet.profile(MODEL, fleet.instances[0])
    assert profile is not None
    graph = ProgramGraph.of(specs(app), tuple(app.program.inputs))
    sizes = {k: len(v) // 4 for k, v in app.program.inputs.items()}
    sizes |= {c.name: c.max_tokens for c in graph.calls}
    prompts = {
        c.name: len(c.prompt) // 4 + sum(sizes[r] for r in c.references) for c in graph.calls
    }
    times = {}
    for call in graph.calls:
        first_s = profile.prefill_s(prompts[call.name])
        times[call.name] = CallTime(
            first_s, first_s + call.max_tokens * profile.decode_step_s_at(1)
        )
    return graph, prompts, times


def critical_s(app: App, config: ServeConfig) -> float:
    """The app's critical path alone, by the profile (engine seconds)."""
    graph, _, times = call_times(app, config)
    return max(critical_path_s(graph, times).values())


def alone_s(app: App, config: ServeConfig, mode: str, rtt_s: float) -> float:
    """The app's latency with nothing else running, by the profile: as a program, its
    critical path and one round trip (the POST out, the result back); call by call, the
    longest chain of calls each paying its own round trip. Both modes do the same engine
    work, so the ratio of the two is the best a program can reach by saving round trips."""
    graph, _, times = call_times(app, config)
    if mode == "program":
        return max(critical_path_s(graph, times).values()) + rtt_s
    padded = {
        name: CallTime(t.first_token_s + rtt_s, t.completion_s + rtt_s) for name, t in times.items()
    }
    return max(critical_path_s(graph, padded).values())


async def as_program(http: httpx.AsyncClient, app: App, deadline_s: float, rtt_s: float) -> bool:
    body = {**app.program.body(), "deadline_s": deadline_s}
    await asyncio.sleep(rtt_s / 2)
    created = await http.post(PROGRAMS, json=body)
    created.raise_for_status()
    await asyncio.sleep(rtt_s)  # the answer comes back; the read goes out
    url = f"{PROGRAMS}/{created.json()['id']}/variables/{app.result}"
    read = await http.get(url, params={"wait_s": 300})
    await asyncio.sleep(rtt_s / 2)
    return bool(read.json()["state"] == "completed")


async def by_calls(http: httpx.AsyncClient, app: App, rtt_s: float) -> bool:
    graph = ProgramGraph.of(specs(app), tuple(app.program.inputs))
    loop = asyncio.get_running_loop()
    outputs: dict[str, asyncio.Future[str]] = {c.name: loop.create_future() for c in graph.calls}

    async def run(call: ProgramCall) -> None:
        values = dict(app.program.inputs)
        for ref in call.references:
            if ref in outputs:
                values[ref] = await outputs[ref]
        await asyncio.sleep(rtt_s / 2)
        body = {"model": call.model, "prompt": render(call.prompt, values),
                "max_tokens": call.max_tokens}  # fmt: skip
        answer = await http.post("/v1/completions", json=body)
        await asyncio.sleep(rtt_s / 2)
        answer.raise_for_status()
        outputs[call.name].set_result(answer.json()["choices"][0]["text"])

    await asyncio.gather(*(run(c) for c in graph.calls))
    return True


def workload(kind: str, setup: Setup, config: ServeConfig) -> tuple[list[App], list[float]]:
    """The point's app instances and their start times (engine seconds): Poisson at the
    setup's rate; one at a time (`rate_per_s` None), each ten critical paths after the one
    before (the live run starts each when the one before ended instead)."""
    docs = documents(setup.seed)
    apps = [APPS[kind](docs[i], MODEL, f"w{setup.seed}x{i}") for i in range(setup.apps)]
    rng = random.Random(setup.seed)
    starts_s, at_s = [], 0.0
    for app in apps:
        starts_s.append(at_s)
        if setup.rate_per_s is None:
            at_s += 10 * critical_s(app, config)
        else:
            at_s += rng.expovariate(setup.rate_per_s)
    return apps, starts_s


async def run_point(kind: str, mode: str, setup: Setup) -> dict[str, Any]:
    config = plane_config(setup)
    apps, starts_s = workload(kind, setup, config)
    wall = 1.0 / setup.speedup
    async with running_plane(config) as plane:
        base = f"http://127.0.0.1:{plane.port}"
        async with httpx.AsyncClient(base_url=base, timeout=3600) as http:
            await asyncio.sleep(1.0)  # the first plan and the agents' first reports
            loop = asyncio.get_running_loop()
            origin = loop.time()

            async def one(app: App, start_s: float) -> Finished:
                await asyncio.sleep(max(0.0, origin + start_s * wall - loop.time()))
                began = loop.time()
                deadline_s = setup.deadline_factor * critical_s(app, config)
                if mode == "program":
                    ok = await as_program(http, app, deadline_s * wall, setup.rtt_s * wall)
                else:
                    ok = await by_calls(http, app, setup.rtt_s * wall)
                return (loop.time() - began) / wall, deadline_s, ok, alone(app, mode, setup)

            if setup.rate_per_s is None:
                done = [await one(a, 0.0) for a in apps]
            else:
                runs = (one(a, s) for a, s in zip(apps, starts_s, strict=True))
                done = list(await asyncio.gather(*runs))
            makespan_s = (loop.time() - origin) / wall
    return summary(kind, mode, done, makespan_s)


def alone(app: App, mode: str, setup: Setup) -> float:
    return alone_s(app, plane_config(setup), mode, setup.rtt_s)


def summary(kind: str, mode: str, done: list[Finished], makespan_s: float) -> dict[str, Any]:
    """One mode's row; `done`: per app, its latency, deadline, whether it completed, and
    its latency alone (`alone_s`), all in engine seconds."""
    latencies = [latency for latency, _, _, _ in done]
    met = sum(ok and latency <= deadline for latency, deadline, ok, _ in done)
    return {
        "app": kind,
        "mode": mode,
        "apps": len(done),
        "alone_s": sum(a for _, _, _, a in done) / len(done),
        "mean_s": sum(latencies) / len(latencies),
        "p50_s": percentile(latencies, 0.5),
        "p99_s": percentile(latencies, 0.99),
        "deadline met": met / len(done),
        "apps per min": 60 * len(done) / makespan_s,
    }


def ratios(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    by_mode = {r["mode"]: r for r in rows}
    program, calls = by_mode["program"], by_mode["calls"]
    return {
        "app": program["app"],
        "alone ratio": program["alone_s"] / calls["alone_s"],
        "mean latency ratio": program["mean_s"] / calls["mean_s"],
        "p99 latency ratio": program["p99_s"] / calls["p99_s"],
        "deadline met (program / calls)": (program["deadline met"], calls["deadline met"]),
    }
