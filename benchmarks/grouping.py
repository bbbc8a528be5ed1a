"""Grouping benchmark: full regroup wall time and incremental add time, per policy.

Workload: Azure-like lengths (prompt lognormal, median 1000 tokens; output cap lognormal,
median 256), three models with skewed shares, the default SLO classes mixed 50/30/20,
arrivals over the last ten minutes.

    .venv/bin/python -m benchmarks.grouping   # a table, and benchmarks/results/grouping.json
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from benchmarks.report import RESULTS_DIR, write_results
from qlm.config import GroupingConfig
from qlm.grouping import make_grouping
from qlm.types import DEFAULT_SLO_CLASSES, Request

MODELS = ("llama-8b", "llama-70b", "mistral-7b")
MODEL_SHARES = (0.5, 0.3, 0.2)
SLO_SHARES = (0.5, 0.3, 0.2)  # interactive, batch-1, batch-2
ARRIVAL_WINDOW_S = 600.0
REGROUP_RUNS = 5
NUM_ADDS = 10_000
POLICIES = ("kmeans", "exact-key")
RESULTS_PATH = RESULTS_DIR / "grouping.json"


def make_requests(num_requests: int, seed: int, prefix: str = "r") -> list[Request]:
    rng = np.random.default_rng(seed)
    models = rng.choice(len(MODELS), size=num_requests, p=MODEL_SHARES).tolist()
    slos = rng.choice(len(DEFAULT_SLO_CLASSES), size=num_requests, p=SLO_SHARES).tolist()
    prompts = np.clip(rng.lognormal(np.log(1000), 1.0, num_requests), 1, 32_000).astype(int)
    outputs = np.clip(rng.lognormal(np.log(256), 0.8, num_requests), 1, 4096).astype(int)
    arrivals = np.sort(rng.uniform(0.0, ARRIVAL_WINDOW_S, num_requests)).tolist()
    return [
        Request.create(
            id=f"{prefix}{i}",
            model=MODELS[models[i]],
            prompt_tokens=int(prompts[i]),
            max_output_tokens=int(outputs[i]),
            slo=DEFAULT_SLO_CLASSES[slos[i]],
            arrival_at_s=arrivals[i],
        )
        for i in range(num_requests)
    ]


def run(num_requests: int = 100_000, seed: int = 0) -> list[dict[str, object]]:
    """One row per policy: regroup median seconds, add median and p99 microseconds."""
    queued = make_requests(num_requests, seed)
    arrivals = make_requests(NUM_ADDS, seed + 1, prefix="new")
    now_s = ARRIVAL_WINDOW_S
    return [_measure(policy, queued, arrivals, now_s) for policy in POLICIES]


def _measure(
    policy_name: str, queued: list[Request], arrivals: list[Request], now_s: float
) -> dict[str, object]:
    config = GroupingConfig(policy=policy_name, recluster_every_inserts=len(arrivals) + 1)
    policy = make_grouping(config)
    regroup_s = []
    for _ in range(REGROUP_RUNS):
        started = time.perf_counter()
        groups = policy.regroup(queued, now_s)
        regroup_s.append(time.perf_counter() - started)
    add_us = []
    for request in arrivals:
        started = time.perf_counter()
        policy.add(request)
        add_us.append((time.perf_counter() - started) * 1e6)
    started = time.perf_counter()
    after = policy.groups()
    groups_after_adds_ms = (time.perf_counter() - started) * 1e3
    return {
        "policy": policy_name,
        "num_requests": len(queued),
        "num_groups": len(groups),
        "max_group_size": max(g.size for g in after),
        "regroup_s_median": statistics.median(regroup_s),
        "regroup_s_max": max(regroup_s),
        "add_us_median": statistics.median(add_us),
        "add_us_p99": float(np.percentile(add_us, 99)),
        "num_adds": len(arrivals),
        "groups_after_adds_ms": groups_after_adds_ms,
    }


def _print_table(rows: list[dict[str, object]]) -> None:
    columns = list(rows[0])
    print(" | ".join(columns))
    for row in rows:
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()]
        print(" | ".join(cells))


if __name__ == "__main__":
    results = run()
    _print_table(results)
    write_results(RESULTS_PATH, results)
    print(f"wrote {RESULTS_PATH}")
