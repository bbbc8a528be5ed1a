"""The simulation runner: a fleet of simulated engines on one virtual clock, driven by a policy.

`simulate(fleet, requests, policy_name, config, seed)` replays the requests (arrival order), lets
the named policy (qlm/sim/policies) answer every arrival, engine event and timer with LSOs, and
applies them to one SimulatedEngine per instance, exactly as the live agents apply them to real
engines. It returns a frozen SimResult.

Events (qlm/sim/events.py), at equal times in this order: engine progress, arrivals, policy
timers, queue-length samples. An engine is woken only at the time it reports as its next event
(`next_event_at_s`), so runs of identical decode steps cost one event. Arrivals are scheduled one
ahead, so the heap stays small however many requests there are.

The run ends when every request has ended, at `max_time_s`, or when nothing has happened for
`stall_s` of virtual time (requests no instance can serve); requests still open are UNFINISHED.

The parts: simulation.py (one run: the event loop, the SimContext, engine events), lso.py (LSOs
applied to engines), tracking.py (per-request and per-instance state, the SimEngine contract).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from qlm.clock import VirtualClock
from qlm.config import QlmConfig
from qlm.config.engine_config import EngineConfig
from qlm.engine.simulated import SimulatedEngine
from qlm.sim.policies import make_policy
from qlm.sim.result import SimResult as SimResult
from qlm.sim.simulation import Progress, Simulation
from qlm.sim.tracking import EngineFactory as EngineFactory
from qlm.sim.tracking import SimConfig, SimEngine, SimulationError
from qlm.types import Fleet, Instance, Request

__all__ = [
    "EngineFactory",
    "SimConfig",
    "SimEngine",
    "SimResult",
    "SimulatedEngines",
    "Simulation",
    "SimulationError",
    "default_engine_factory",
    "simulate",
]


def simulate(
    fleet: Fleet,
    requests: Sequence[Request],
    policy_name: str,
    config: QlmConfig,
    seed: int,
    *,
    progress: Progress | None = None,
    options: SimConfig | None = None,
    policy_options: Mapping[str, object] | None = None,
    engine_factory: EngineFactory | None = None,
) -> SimResult:
    """Run one policy over the requests on the fleet; same inputs and seed, same result."""
    policy = make_policy(policy_name, **dict(policy_options or {}))
    engines = engine_factory or SimulatedEngines()
    if policy.engine_settings and isinstance(engines, SimulatedEngines):
        base = engines.config or EngineConfig()
        update = {**base.model_dump(), **policy.engine_settings}
        engines = replace(engines, config=EngineConfig.model_validate(update))
    sim = Simulation(
        fleet,
        requests,
        policy,
        config,
        seed,
        options=options or SimConfig(),
        progress=progress,
        engine_factory=engines,
    )
    return sim.run()


@dataclass(frozen=True, slots=True)
class SimulatedEngines:
    """The default EngineFactory: one SimulatedEngine per instance, with these scheduler
    settings and output-length policy ("cap": each request generates max_output_tokens;
    "profile": drawn per request from the seed the runner derives from the run's seed)."""

    config: EngineConfig | None = None
    output_length: str = "cap"

    def __call__(
        self, instance: Instance, fleet: Fleet, clock: VirtualClock, seed: int
    ) -> SimEngine:
        engine: SimEngine = SimulatedEngine(
            instance, fleet, clock, self.config, self.output_length, seed
        )
        return engine


default_engine_factory = SimulatedEngines()
