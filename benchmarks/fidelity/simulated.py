"""The simulated run: the live run's requests (their live arrival times) through the simulator,
its control loop set like the live one, on the up-front or the re-measured step model."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from benchmarks.fidelity.outcomes import LiveRun, Outcome
from qlm.sim.result import OutcomeState, SimResult
from qlm.sim.scenario import Scenario
from qlm.sim.simulate import simulate
from qlm.types import Fleet, Request


def sim_run(
    scenario: Scenario, requests: Sequence[Request], live: LiveRun, fleet: Fleet | None = None
) -> SimResult:
    """The same requests through the simulator, its control loop set like the live one (the
    scenario's qlm.control is the fleet file's) and each solve charged the live median; on
    the scenario's fleet (the profile files) unless another is given."""
    latency = statistics.median(live.solve_s) if live.solve_s else 0.0
    options = {"planning_latency_s": latency}
    fleet = fleet or scenario.fleet()
    return simulate(fleet, requests, "qlm", scenario.config, 0, policy_options=options)


def sim_outcomes(result: SimResult) -> list[Outcome]:
    return [
        Outcome(
            id=o.request_id,
            slo_class=o.slo_class,
            model=o.model,
            arrival_s=o.arrival_s,
            dispatch_s=o.dispatch_s,
            first_token_s=o.first_token_s,
            finish_s=o.finish_s if o.state is OutcomeState.COMPLETED else None,
            met_slo=o.met_slo,
            evictions=o.evictions,
            instance=o.instance_id,
        )
        for o in result.outcomes
    ]
