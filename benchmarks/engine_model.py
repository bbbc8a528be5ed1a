"""Engine-model benchmark: how fast one simulated engine serves 10,000 requests.

Scenarios (packaged profiles; Azure-like lengths: prompts lognormal with median 1,020 tokens,
true output lengths drawn from the profile's lognormal, mean 211, std 163):

* backlog-A100:  Mistral-7B on one A100, all requests queued at t = 0 (a full batch of 256)
* poisson-A100:  Mistral-7B on one A100, Poisson arrivals at 8 requests/s (about 90% of
                 what it sustains, about 9 requests/s)
* light-A100:    the same at 1 request/s: long runs of identical decode steps
* backlog-A10:   Mistral-7B on one A10, all queued at t = 0: KV-bound, recompute preemptions
* backlog-70B:   Llama-70B on 4 x A100, all queued at t = 0
* naive-A100:    the step-by-step reference engine of the tests (one Python step per
                 iteration, no fast-forwarding) on the backlog-A100 workload, cut to 2,000
                 requests, against EngineModel on the same 2,000

    .venv/bin/python -m benchmarks.engine_model
        # a table, and benchmarks/results/engine_model.json

Reported per scenario: wall seconds, simulated seconds, events (FirstToken + RequestFinished),
iterations, segments (runs of iterations computed in one go), preemptions, and the rates
simulated tokens/s (prefill + decode tokens, recomputation included, per wall second), output
tokens/s (generated tokens per wall second), events/s, and simulated seconds per wall second.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from benchmarks.report import RESULTS_DIR, write_results
from qlm.config.profile_files import profile_named
from qlm.engine.model.core import EngineModel
from qlm.engine.model.output_length import lognormal_params
from qlm.perf.profile import Profile
from qlm.types import DEFAULT_GPU_TYPES, Instance, Request
from tests.engine.reference import RefRequest, run_reference

RESULTS_PATH = RESULTS_DIR / "engine_model.json"
NUM_REQUESTS = 10_000
NAIVE_REQUESTS = 2_000
PROMPT_MEDIAN_TOKENS = 1020
PROMPT_SIGMA = 0.8


@dataclass(frozen=True)
class Workload:
    arrivals_s: list[float]
    prompts: list[int]
    outputs: list[int]


def workload(profile: Profile, n: int, rate_per_s: float | None, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    prompts = np.clip(rng.lognormal(math.log(PROMPT_MEDIAN_TOKENS), PROMPT_SIGMA, n), 1, 8000)
    mu, sigma = lognormal_params(profile.output_tokens_mean, profile.output_tokens_std)
    outputs = np.clip(np.rint(rng.lognormal(mu, sigma, n)), 1, 4096)
    if rate_per_s is None:
        arrivals = np.zeros(n)
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    return Workload(arrivals.tolist(), prompts.astype(int).tolist(), outputs.astype(int).tolist())


def instance(profile: Profile) -> Instance:
    memory = DEFAULT_GPU_TYPES[profile.gpu_type].memory_bytes
    return Instance("bench", profile.gpu_type, profile.gpu_count, memory, profile.model)


def requests(profile: Profile, w: Workload) -> list[Request]:
    return [
        Request(
            id=f"r{i}",
            model=profile.model,
            prompt_tokens=p,
            max_output_tokens=o,
            slo_class="batch-2",
            arrival_at_s=a,
            ttft_deadline_at_s=a + 3600.0,
        )
        for i, (a, p, o) in enumerate(zip(w.arrivals_s, w.prompts, w.outputs, strict=True))
    ]


def run_model(name: str, profile: Profile, w: Workload) -> dict[str, object]:
    reqs = requests(profile, w)
    start = time.perf_counter()
    model = EngineModel(instance(profile), [profile])
    events = 0
    for r in reqs:
        events += len(model.advance_to(r.arrival_at_s))
        model.add(r, r.arrival_at_s)
    end_events = model.advance_to(math.inf)
    wall_s = time.perf_counter() - start
    events += len(end_events)
    s = model.stats
    sim_s = max(e.at_s for e in end_events) if end_events else model.now_s
    return _row(
        name,
        profile,
        len(reqs),
        wall_s,
        sim_s,
        events,
        s.iterations,
        s.segments,
        s.preemptions,
        s.prefill_tokens + s.decode_tokens,
        sum(w.outputs),  # every request runs to its true length
    )


def run_naive(profile: Profile, w: Workload) -> dict[str, object]:
    inst = instance(profile)
    capacity = profile.kv_capacity_tokens(inst.gpu_memory_bytes)
    refs = [
        RefRequest(f"r{i}", a, p, o)
        for i, (a, p, o) in enumerate(zip(w.arrivals_s, w.prompts, w.outputs, strict=True))
    ]
    start = time.perf_counter()
    res = run_reference(profile, capacity, profile.max_batch_size, 2048, refs)
    wall_s = time.perf_counter() - start
    events = len(res.first_token_s) + len(res.finish_s)
    generated = sum(res.output_tokens.values())
    tokens = sum(w.prompts) + generated  # no preemptions on this workload
    sim_s = max(res.finish_s.values())
    return _row(
        "naive-A100 (reference)",
        profile,
        len(refs),
        wall_s,
        sim_s,
        events,
        res.iterations,
        res.iterations,
        res.preemptions,
        tokens,
        generated,
    )


def _row(
    name: str,
    profile: Profile,
    n: int,
    wall_s: float,
    sim_s: float,
    events: int,
    iterations: int,
    segments: int,
    preemptions: int,
    tokens: int,
    generated: int,
) -> dict[str, object]:
    return {
        "scenario": name,
        "profile": f"{profile.model}@{profile.gpu_count}x{profile.gpu_type}",
        "requests": n,
        "wall_s": round(wall_s, 3),
        "simulated_s": round(sim_s, 1),
        "events": events,
        "iterations": iterations,
        "segments": segments,
        "preemptions": preemptions,
        "sim_tokens_per_s": round(tokens / wall_s),
        "out_tokens_per_s": round(generated / wall_s),
        "events_per_s": round(events / wall_s),
        "sim_s_per_wall_s": round(sim_s / wall_s),
    }


def main() -> int:
    a100 = profile_named("mistral-7b", "A100")
    a10 = profile_named("mistral-7b", "A10")
    big = profile_named("llama-70b", "A100")
    backlog = workload(a100, NUM_REQUESTS, None)
    small = Workload(
        backlog.arrivals_s[:NAIVE_REQUESTS],
        backlog.prompts[:NAIVE_REQUESTS],
        backlog.outputs[:NAIVE_REQUESTS],
    )
    rows = [
        run_model("backlog-A100", a100, backlog),
        run_model("poisson-A100", a100, workload(a100, NUM_REQUESTS, 8.0)),
        run_model("light-A100", a100, workload(a100, NUM_REQUESTS, 1.0)),
        run_model("backlog-A10", a10, workload(a10, NUM_REQUESTS, None)),
        run_model("backlog-70B", big, workload(big, NUM_REQUESTS, None)),
        run_model("naive-A100 (model)", a100, small),
        run_naive(a100, small),
    ]
    columns = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(columns, widths, strict=True)))
    write_results(RESULTS_PATH, {"python": sys.version.split()[0], "rows": rows})
    print(f"wrote {RESULTS_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
