"""The searches of benchmarks/density/: the smallest fleet meeting the target per approach.

* pooled (`pooled_fleet`): every model shares one fleet of 1-GPU H100 and 4-GPU A100 instances,
  the policy moving models between them (qlm with and without the standby tier). For each
  count of A100 instances, a bisection finds the fewest H100 instances meeting the target
  (attainment is taken to grow with instances; the three counts below its answer are tried
  too, as it does not quite); the fleet with the fewest GPUs wins, then the cheapest.
* dedicated (`dedicated_fleet`): every model on its own replicas, no swaps: each model's
  requests alone on k instances of its GPU type, k = 1, 2, ... until the model meets the
  target; the fleet is the sum. Run with qlm's scheduling and with llmd's.

Every evaluation is one simulation of the same requests (drawn once per seed); it drains:
arrivals stop at the horizon and the run goes on until every request has ended, so each
request is judged against its own deadline (`simulated`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.density.scenario import LARGE, SMALL
from qlm.config.fleet_config import InstanceGroupConfig
from qlm.sim.miss_causes import miss_cause_counts
from qlm.sim.result import SimResult
from qlm.sim.scenario import Scenario
from qlm.sim.simulate import SimConfig, SimulatedEngines, simulate
from qlm.types import Request


@dataclass(frozen=True, slots=True)
class Fleet:
    counts: dict[str, int]  # instances per GPU type
    gpus: int
    cost_per_hour: float
    attainment: float
    evaluations: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "gpus": self.gpus,
            "cost_per_hour": round(self.cost_per_hour, 2),
            "attainment": round(self.attainment, 4),
            "evaluations": self.evaluations,
        }


def attainment_of(
    scenario: Scenario,
    requests: Sequence[Request],
    policy: str,
    seed: int,
    policy_options: dict[str, object] | None = None,
) -> float:
    return simulated(scenario, requests, policy, seed, policy_options).attainment()


def simulated(
    scenario: Scenario,
    requests: Sequence[Request],
    policy: str,
    seed: int,
    policy_options: dict[str, object] | None = None,
) -> SimResult:
    """One run that drains: `requests` arrive up to the scenario's horizon and the run goes
    on until each has ended (or nothing happens for the runner's stall time). A run cut at
    the horizon counts a request still on its way to its deadline (a batch request of the
    last 600 s, an interactive one of the last 5 s) as a miss."""
    return simulate(
        scenario.fleet(),
        requests,
        policy,
        scenario.config,
        seed,
        options=SimConfig(),
        policy_options=policy_options,
        engine_factory=SimulatedEngines(scenario.engine),
    )


def grid_rows(
    scenario: Scenario,
    requests: Sequence[Request],
    policy: str,
    seed: int,
    fleets: Sequence[str],
    policy_options: dict[str, object] | None = None,
) -> list[dict[str, Any]]:
    """Attainment and the misses by cause (qlm/causes/classify.py) on each fleet (`"H100/A100"`
    counts), same requests: where a fleet falls short, and why."""
    rows = []
    for fleet in fleets:
        small, large = (int(n) for n in fleet.split("/"))
        sized = scenario.with_fleet_counts({SMALL: small, LARGE: large})
        result = simulated(sized, requests, policy, seed, policy_options)
        causes = miss_cause_counts(result.outcomes, result.end_s)
        row: dict[str, Any] = {"seed": seed, "fleet": f"{small} x {SMALL}, {large} x {LARGE}"}
        row |= {"gpus": _gpus(sized), "attainment": round(result.attainment(), 4)}
        row |= {"swaps": result.total_swaps} | {c: n for c, n in causes.items() if n}
        print(f"  grid {fleet}: {row}", flush=True)
        rows.append(row)
    return rows


def fetch_pairs(
    scenario: Scenario, requests: Sequence[Request], policy: str, seed: int, fleets: Sequence[str]
) -> list[dict[str, Any]]:
    """Attainment with and without filling the standby tiers (qlm/agents/warming.py) on the
    same fleets (`"H100 count/A100 count"`), same requests."""
    rows = []
    for fleet in fleets:
        small, large = (int(n) for n in fleet.split("/"))
        sized = scenario.with_fleet_counts({SMALL: small, LARGE: large})
        off, on = (
            attainment_of(sized, requests, policy, seed, {"fetch_standby": fetch})
            for fetch in (False, True)
        )
        print(f"  fetch {fleet}: off {off:.4f} on {on:.4f}", flush=True)
        counts = f"{small} x {SMALL}, {large} x {LARGE}"
        rows.append({"seed": seed, "fleet": counts, "gpus": _gpus(sized), "off": round(off, 4),
                     "on": round(on, 4), "points": round(100 * (on - off), 2)})  # fmt: skip
    return rows


def _gpus(scenario: Scenario) -> int:
    return round(sum(i.gpus for i in scenario.fleet().instances))


def _least(
    meets: Callable[[int], float], low: int, high: int, target: float, below: int = 0
) -> int | None:
    """The least k in [low, high] with meets(k) >= target (bisection), None if high fails.
    Attainment is not quite monotonic in k (a policy's choices shift with the fleet), so the
    `below` counts under the bisection's answer are tried too; the least that meets wins."""
    if meets(high) < target:
        return None
    while low < high:
        mid = (low + high) // 2
        if meets(mid) >= target:
            high = mid
        else:
            low = mid + 1
    tried = range(max(0, low - below), low)
    return min((k for k in tried if meets(k) >= target), default=low)


def pooled_fleet(
    scenario: Scenario,
    requests: Sequence[Request],
    policy: str,
    seed: int,
    target: float,
    max_small: int,
    large_counts: Sequence[int],
) -> Fleet | None:
    seen: dict[tuple[int, int], float] = {}

    def value(small: int, large: int) -> float:
        if (small, large) not in seen:
            sized = scenario.with_fleet_counts({SMALL: small, LARGE: large})
            seen[(small, large)] = attainment_of(sized, requests, policy, seed)
            print(f"  {policy} {SMALL} {small} {LARGE} {large}: {seen[(small, large)]:.4f}")
        return seen[(small, large)]

    found: list[Fleet] = []
    for large in large_counts:
        small = _least(lambda k, large=large: value(k, large), 0, max_small, target, below=3)
        if small is not None:
            sized = scenario.with_fleet_counts({SMALL: small, LARGE: large})
            counts = {SMALL: small, LARGE: large}
            cost = sized.fleet_cost_per_hour()
            found.append(Fleet(counts, _gpus(sized), cost, value(small, large), len(seen)))
    return min(found, key=lambda f: (f.gpus, f.cost_per_hour), default=None)


def dedicated_fleet(
    scenario: Scenario,
    requests: Sequence[Request],
    policy: str,
    seed: int,
    target: float,
    max_replicas: int,
) -> tuple[Fleet | None, dict[str, int]]:
    """The dedicated fleet, and each model's replicas."""
    gpu_of = {g.model: g.gpu_type for g in scenario.fleet_config.instances if g.model}
    replicas: dict[str, int] = {}
    gpus = evaluations = 0
    cost = 0.0
    for model in sorted(gpu_of):
        mine = [r for r in requests if r.model == model]

        def alone(k: int, model: str = model) -> Scenario:
            group = InstanceGroupConfig(gpu_type=gpu_of[model], count=k, model=model)
            fleet = scenario.fleet_config.model_copy(update={"instances": (group,)})
            return scenario.model_copy(update={"fleet_config": fleet})

        for k in range(1, max_replicas + 1):
            evaluations += 1
            if not mine or attainment_of(alone(k), mine, policy, seed) >= target:
                break
        else:
            return None, replicas
        replicas[model] = k
        gpus += _gpus(alone(k))
        cost += alone(k).fleet_cost_per_hour()
        print(f"  {policy} dedicated {model}: {k} replica(s)")
    counts: dict[str, int] = {}
    for model, k in replicas.items():
        counts[gpu_of[model]] = counts.get(gpu_of[model], 0) + k
    groups = tuple(
        InstanceGroupConfig(gpu_type=gpu_of[m], count=k, model=m) for m, k in replicas.items()
    )
    whole = scenario.model_copy(
        update={"fleet_config": scenario.fleet_config.model_copy(update={"instances": groups})}
    )
    value = attainment_of(whole, requests, policy, seed)  # all models at once, as placed
    return Fleet(counts, gpus, cost, value, evaluations + 1), replicas
