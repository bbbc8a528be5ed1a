"""The programs benchmark on the simulator: the same applications and arrivals as the live
points, as requests with dependencies (qlm/sim/dependencies.py). As a program, a call arrives
when its inputs end and keeps the deadlines the program gave it (qlm/programs/deadlines.py);
call by call, it arrives a client round trip later, due by its class's targets from then. An
application's latency runs from its start to its result's end plus half a round trip (the
answer's way back); its first calls arrive half a round trip after its start in both modes."""

from __future__ import annotations

from typing import Any

from benchmarks.programs.apps import App
from benchmarks.programs.run import (
    MODEL,
    Setup,
    alone,
    call_times,
    critical_s,
    plane_config,
    summary,
    workload,
)
from qlm.config.serve_config import ServeConfig
from qlm.programs.deadlines import call_deadlines
from qlm.sim.dependencies import Dependency
from qlm.sim.simulate import SimConfig, simulate
from qlm.types import Request

POLICY = "qlm"


def app_requests(
    app: App, index: int, start_s: float, mode: str, setup: Setup, config: ServeConfig
) -> tuple[list[Request], dict[str, Dependency], float]:
    """The app's calls as requests and their dependencies, and its deadline (seconds)."""
    graph, prompts, times = call_times(app, config)
    deadline_s = setup.deadline_factor * critical_s(app, config)
    shares = call_deadlines(graph, times, deadline_s)
    ttft_target_s = config.qlm.slo_class_map()["interactive"].ttft_s
    requests, deps = [], {}
    for call in graph.calls:
        rid = f"a{index}.{call.name}"
        inputs = tuple(f"a{index}.{r}" for r in call.references if r not in app.program.inputs)
        at_s = start_s + (0.0 if inputs else setup.rtt_s / 2)
        if mode == "program":
            ttft_s, done_s = start_s + shares[call.name].ttft_s, start_s + shares[call.name].done_s
            ttft_s = max(ttft_s, at_s)
        else:
            ttft_s, done_s = at_s + ttft_target_s, None
        done_s = None if done_s is None else max(done_s, ttft_s)
        fields = (prompts[call.name], call.max_tokens, "interactive", at_s, ttft_s, done_s)
        requests.append(Request(rid, MODEL, *fields))
        if inputs:
            delay_s = 0.0 if mode == "program" else setup.rtt_s
            deps[rid] = Dependency(inputs, delay_s, shift_deadlines=mode != "program")
    return requests, deps, deadline_s


def sim_point(kind: str, mode: str, setup: Setup) -> dict[str, Any]:
    config = plane_config(setup)
    apps, starts_s = workload(kind, setup, config)
    requests, deps, deadlines = [], {}, []
    for i, (app, start_s) in enumerate(zip(apps, starts_s, strict=True)):
        reqs, app_deps, deadline_s = app_requests(app, i, start_s, mode, setup, config)
        requests += reqs
        deps |= app_deps
        deadlines.append(deadline_s)
    result = simulate(config.fleet(), requests, POLICY, config.qlm, setup.seed,
                      options=SimConfig(dependencies=deps))  # fmt: skip
    finish = {o.request_id: o.finish_s for o in result.outcomes}
    done = []
    for i, (app, start_s) in enumerate(zip(apps, starts_s, strict=True)):
        end_s = finish.get(f"a{i}.{app.result}")
        ok = end_s is not None
        latency_s = (end_s if end_s is not None else result.end_s) + setup.rtt_s / 2 - start_s
        done.append((latency_s, deadlines[i], ok, alone(app, mode, setup)))
    return summary(kind, mode, done, result.end_s - starts_s[0])
