"""The programs benchmark on the simulator: the same applications and arrivals as the live
points, as requests with dependencies (qlm/sim/dependencies.py). As a program, a call arrives
when its inputs end and keeps the deadlines the program gave it (qlm/programs/deadlines.py);
call by call, it arrives a client round trip later, due by its class's targets from then. An
application's latency runs from its start to its result's end plus half a round trip (the
answer's way back); its first calls arrive half a round trip after its start in both modes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from benchmarks.programs.apps import App, text
from benchmarks.programs.run import (
    MODEL,
    Setup,
    alone,
    call_times,
    critical_s,
    plane_config,
    specs,
    summary,
    workload,
)
from qlm.config.serve_config import ServeConfig
from qlm.prefixes.prompt_blocks import prompt_prefix
from qlm.programs.deadlines import call_deadlines
from qlm.programs.fork import leaders
from qlm.programs.graph import ProgramGraph, render
from qlm.sim.dependencies import Dependency
from qlm.sim.simulate import SimConfig, simulate
from qlm.types import PrefixBlock, Request

POLICY = "qlm"


def prefixes(app: App, mode: str) -> dict[str, tuple[PrefixBlock, ...]]:
    """Each call's prompt blocks as the API cuts them (qlm/prefixes/prompt_blocks.py): its
    prompt filled with the app's inputs and, for the calls it uses, placeholder text of their
    output caps (the simulator makes no text); a program's call also ends a block at its
    template's first variable. `calls-unshared`: none (a server that shares nothing across
    requests: Parrot's baseline)."""
    if mode == "calls-unshared":
        return {}
    graph = ProgramGraph.of(specs(app), tuple(app.program.inputs))
    values = dict(app.program.inputs)
    values |= {c.name: text(c.max_tokens, f"out-{c.name}") for c in graph.calls}
    out = {}
    for call in graph.calls:
        prompt = render(call.prompt, values)
        cuts = (len(call.head),) if mode == "program" else ()
        out[call.name] = prompt_prefix(prompt, len(prompt) // 4, cuts=cuts)
    return out


def fork_leaders(graph: ProgramGraph, blocks: dict[str, tuple[PrefixBlock, ...]]) -> dict[str, str]:
    """The program runner's fork rule (qlm/programs/fork.py) over the calls that become
    ready together here: those that use the same other calls (the runner queues them in
    one round)."""
    calls = {c.name for c in graph.calls}
    together: dict[frozenset[str], dict[str, tuple[PrefixBlock, ...]]] = {}
    for call in graph.calls:
        uses = frozenset(r for r in call.references if r in calls)
        together.setdefault(uses, {})[call.name] = blocks.get(call.name, ())
    return {m: lead for group in together.values() for m, lead in leaders(group).items()}


def unique_tokens(app: App, config: ServeConfig) -> int:
    """Prompt tokens the app's calls hold once each: every distinct block of their text once
    (as call by call cuts them), and each call's own tail: what a server that reuses all it
    can computes, whatever the mode run."""
    _, prompts, _ = call_times(app, config)
    seen: dict[int, int] = {}
    own = 0
    for name, blocks in prefixes(app, "calls").items():
        for block in blocks:
            seen.setdefault(block.key, block.tokens)
        own += max(0, prompts[name] - sum(b.tokens for b in blocks))
    return sum(seen.values()) + own


def app_requests(
    app: App, index: int, start_s: float, mode: str, setup: Setup, config: ServeConfig
) -> tuple[list[Request], dict[str, Dependency], float]:
    """The app's calls as requests and their dependencies, and its deadline (seconds)."""
    graph, prompts, times = call_times(app, config)
    deadline_s = setup.deadline_factor * critical_s(app, config)
    shares = call_deadlines(graph, times, deadline_s)
    ttft_target_s = config.qlm.slo_class_map()["interactive"].ttft_s
    blocks = prefixes(app, mode)
    waits = fork_leaders(graph, blocks) if mode == "program" else {}
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
        request = Request(rid, MODEL, *fields)
        leader = waits.get(call.name)
        request = replace(
            request,
            prefix=_fitted(blocks.get(call.name, ()), request),
            job_leader=None if leader is None else f"a{index}.{leader}",
        )
        requests.append(request)
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
    # prompt tokens computed: those admitted less those found cached (a request without
    # blocks is computed whole; one preempted and admitted again counts again)
    with_blocks = sum(p for p, _ in result.prefix_tokens.values())
    hits = sum(h for _, h in result.prefix_tokens.values())
    bare = sum(r.prompt_tokens for r in requests if not r.prefix)
    computed = with_blocks - hits + bare
    finish = {o.request_id: o.finish_s for o in result.outcomes}
    done = []
    for i, (app, start_s) in enumerate(zip(apps, starts_s, strict=True)):
        end_s = finish.get(f"a{i}.{app.result}")
        ok = end_s is not None
        latency_s = (end_s if end_s is not None else result.end_s) + setup.rtt_s / 2 - start_s
        done.append((latency_s, deadlines[i], ok, alone(app, mode, setup)))
    row = summary(kind, mode, done, result.end_s - starts_s[0])
    unique = sum(unique_tokens(app, config) for app in apps)
    row["prefilled twice per app"] = max(0, computed - unique) / len(apps)
    return row


def _fitted(blocks: tuple[PrefixBlock, ...], request: Request) -> tuple[PrefixBlock, ...]:
    """The blocks, the last cut short where the placeholder text ran past the prompt's
    token count (the two count alike to within a few tokens)."""
    out, total = [], 0
    for block in blocks:
        if total + block.tokens > request.prompt_tokens:
            break
        out.append(block)
        total += block.tokens
    return tuple(out)
