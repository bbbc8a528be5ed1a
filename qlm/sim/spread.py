"""Where independent simulations run: in this process, one after another (the default), or
spread over a Ray cluster (`--ray ADDRESS`, or the `RAY_ADDRESS` environment variable).

A simulation is deterministic (virtual clock, seeded draws, CP-SAT on a deterministic work
budget), so where it runs does not change its result: `qlm simulate` writes the same files
either way (tests/sim/test_spread.py runs both on a local Ray head). What crosses to a worker
is a `PolicyRun` (the scenario, a policy name, the seed), what comes back its `SimResult`;
every worker needs `qlm` installed at the same version (the head started from the same
environment, or `pip install "qlm[ray]"` on every node).

    ray start --head --num-cpus 8           # or an existing cluster
    qlm simulate sims/wb.yaml --ray 127.0.0.1:6379 --sweep rate=0.5,1,2,4
    qlm capacity sims/wb.yaml --target 0.99 --ray 127.0.0.1:6379

`qlm capacity` sends `FleetRun`s (a sized scenario with the search's requests, drawn once)
and gets attainments back (qlm/sim/capacity_cli.py says which fleets go at once).

Ray is an optional dependency (`pip install "qlm[ray]"`); without `--ray` nothing imports it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from qlm.config import ConfigError
from qlm.sim.result import SimResult
from qlm.sim.scenario import Scenario
from qlm.types import Request

T = TypeVar("T")
R = TypeVar("R")
RAY_ENV = "RAY_ADDRESS"


class Runner(Protocol):
    """Runs a function over independent jobs; answers in the jobs' order."""

    name: str

    def map(self, fn: Callable[[T], R], jobs: Sequence[T]) -> list[R]: ...


class LocalRunner:
    """Each job in this process, one after another."""

    name = "local"

    def map(self, fn: Callable[[T], R], jobs: Sequence[T]) -> list[R]:
        return [fn(job) for job in jobs]


class RayRunner:
    """Each job as a Ray task on the cluster at `address` (one CPU each)."""

    name = "ray"

    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError(
                f"--ray {address}: Ray is not installed (pip install 'qlm[ray]')"
            ) from None
        self._ray: Any = ray
        self.address = address
        if not ray.is_initialized():
            try:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"--ray {address}: no Ray cluster there ({exc})") from None

    def map(self, fn: Callable[[T], R], jobs: Sequence[T]) -> list[R]:
        task = self._ray.remote(num_cpus=1)(fn)
        return list(self._ray.get([task.remote(job) for job in jobs]))


def make_runner(address: str | None = None) -> Runner:
    """Ray at `address`, else at $RAY_ADDRESS; local without either."""
    address = address or os.environ.get(RAY_ENV) or None
    return LocalRunner() if address is None else RayRunner(address)


@dataclass(frozen=True)
class PolicyRun:
    """One simulation: a policy on a scenario's requests at a seed."""

    scenario: Scenario
    policy: str
    seed: int


def run_policy(job: PolicyRun, progress: Callable[[int, int], None] | None = None) -> SimResult:
    """The simulation of one `PolicyRun`, as `qlm simulate` runs each policy; `progress`
    (requests ended, total) only where it runs in this process."""
    from qlm.sim.simulate import SimConfig, SimulatedEngines, simulate

    scenario = job.scenario
    return simulate(
        scenario.fleet(),
        scenario.requests(job.seed),
        job.policy,
        scenario.config,
        job.seed,
        progress=progress,
        options=SimConfig(max_time_s=scenario.horizon_s or math.inf),
        engine_factory=SimulatedEngines(scenario.engine),
    )


@dataclass(frozen=True)
class FleetRun:
    """One fleet of a capacity search: a policy on given requests; the attainment asked."""

    scenario: Scenario
    requests: tuple[Request, ...]
    policy: str
    seed: int
    slo_class: str | None = None


def run_fleet(job: FleetRun) -> float:
    """The attainment (overall, or of `slo_class`) of one fleet of a capacity search."""
    from qlm.sim.simulate import SimConfig, SimulatedEngines, simulate

    scenario = job.scenario
    result = simulate(
        scenario.fleet(),
        list(job.requests),
        job.policy,
        scenario.config,
        job.seed,
        options=SimConfig(max_time_s=scenario.horizon_s or math.inf),
        engine_factory=SimulatedEngines(scenario.engine),
    )
    return result.attainment(job.slo_class)


def spread_policies(
    runner: Runner,
    scenarios: Sequence[Scenario],
    policies: Sequence[str],
    seed: int,
    here: Callable[[Scenario], list[SimResult]],
) -> Iterator[tuple[Scenario, list[SimResult]]]:
    """Each scenario with its policies' results, in the given orders. Locally one scenario at
    a time through `here` (progress bars and all, as before); on Ray every (scenario, policy)
    run at once."""
    if isinstance(runner, LocalRunner):
        for scenario in scenarios:
            yield scenario, here(scenario)
        return
    jobs = [PolicyRun(scenario, policy, seed) for scenario in scenarios for policy in policies]
    flat = runner.map(run_policy, jobs)
    n = len(policies)
    for k, scenario in enumerate(scenarios):
        yield scenario, flat[k * n : (k + 1) * n]
