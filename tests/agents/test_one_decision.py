"""One decision, two planes: the simulator's input builder (`SimDispatch`, over the simulation's
exact state) and the live agent's (`AgentQueue` over `ReportedFleet`: its own engine and the
other agents' status reports) are given one queue and fleet state, and must decide alike for
every instance: whether it follows the plan to another model, and what it serves next."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pytest

from qlm.agents.agent_reports import instance_status
from qlm.agents.live_queue import AgentQueue
from qlm.agents.reported_fleet import ReportedFleet
from qlm.clock import VirtualClock
from qlm.config import QlmConfig
from qlm.control.plan import PublishedPlan, planned_group
from qlm.engine.engine_types import EngineObservation, EngineRequest, EngineState
from qlm.sim.policies.qlm_dispatch import SimDispatch
from qlm.types import Fleet, Request
from tests.factories import make_instance, make_profile, make_request

MODELS = ("m7b", "m13b")
PRIORITY = {"interactive": 2, "batch-1": 1, "batch-2": 0}
TTFT_S = {"interactive": 20.0, "batch-1": 60.0, "batch-2": 600.0}


@dataclass
class FakeSim:
    """A `SimContext` frozen at one moment: what the simulator's dispatch reads."""

    fleet: Fleet
    config: QlmConfig
    clock: VirtualClock
    state: dict[str, tuple[str | None, bool]]  # instance -> (model, loading)
    observations: dict[str, EngineObservation]
    requests: dict[str, Request] = field(default_factory=dict)

    def queued(self) -> Mapping[str, Request]:
        return self.requests

    def observe(self, instance_id: str) -> EngineObservation:
        return self.observations[instance_id]

    def held(self, instance_id: str) -> int:
        return len(self.observations[instance_id].requests)

    def model_of(self, instance_id: str) -> str | None:
        return self.state[instance_id][0]

    def loading(self, instance_id: str) -> bool:
        return self.state[instance_id][1]

    def serving(self, model: str) -> tuple[str, ...]:
        return tuple(i.id for i in self.fleet.instances if self.state[i.id] == (model, False))

    def max_num_seqs(self, instance_id: str) -> int:
        return self.observations[instance_id].max_num_seqs

    def rng(self, component: str) -> np.random.Generator:
        return np.random.default_rng(0)

    def call_at(self, at_s: float, tag: str) -> None:
        pass


def draw_state(rng: random.Random, now_s: float) -> FakeSim:
    """Four instances, two models, each instance serving, loading or empty, with admitted work
    of random classes; 0-120 queued requests per model that arrived over the last minute."""
    ids = [f"i{k}" for k in range(4)]
    fleet = Fleet.of(
        [make_instance(i, loaded_model=None) for i in ids],
        [make_profile("m7b", load_s=8.0), make_profile("m13b", weight_gib=26.0, load_s=15.0)],
    )
    state: dict[str, tuple[str | None, bool]] = {}
    observations = {}
    for i in ids:
        model = rng.choice((*MODELS, *MODELS, None))
        loading = model is not None and rng.random() < 0.2
        state[i] = (model, loading)
        admitted = tuple(
            EngineRequest(
                f"{i}-a{k}", rng.choice(list(PRIORITY)), rng.randint(50, 3000),
                rng.randint(10, 400), rng.randint(0, 5), rng.random() < 0.6,
            )
            for k in range(0 if model is None or loading else rng.randint(0, 70))
        )  # fmt: skip
        engine_state = EngineState.LOADING if loading else EngineState.READY
        observations[i] = EngineObservation(
            i, engine_state, model, admitted, sum(r.context_tokens for r in admitted),
            400_000, 64, at_s=now_s, standby_capacity=rng.choice((0, 1)),
        )  # fmt: skip
    config = QlmConfig.model_validate(
        {
            "slo_classes": [
                {"name": n, "ttft_s": t, "priority": PRIORITY[n]} for n, t in TTFT_S.items()
            ]
        }
    )
    clock = VirtualClock(now_s)
    sim = FakeSim(fleet, config, clock, state, observations)
    for model in MODELS:
        for _ in range(rng.choice((0, rng.randint(1, 120)))):
            slo = rng.choice(list(TTFT_S))
            request = make_request(
                model=model, slo_class=slo, prompt_tokens=rng.randint(20, 4000),
                max_output_tokens=rng.randint(5, 600), arrival_at_s=now_s - rng.uniform(0, 60),
                ttft_s=TTFT_S[slo],
            )  # fmt: skip
            sim.requests[request.id] = request
    return sim


def random_plan(rng: random.Random, sim: FakeSim) -> PublishedPlan:
    """Every queued request in a group of its model, the groups dealt to random instances."""
    groups = {}
    queues: dict[str, list[str]] = {i.id: [] for i in sim.fleet.instances}
    for model in MODELS:
        members = [r for r in sim.requests.values() if r.model == model]
        rng.shuffle(members)
        while members:
            size = rng.randint(1, 40)
            gid = f"g{len(groups)}"
            groups[gid] = planned_group(gid, model, members[:size])
            members = members[size:]
            queues[rng.choice(list(queues))].append(gid)
    return PublishedPlan(1, sim.clock.now_s(), {i: tuple(q) for i, q in queues.items()}, groups)


def names(heads: tuple[object, ...]) -> list[tuple[str, list[str]]]:
    return [(g.model, [it.request_id for it in g.items]) for g in heads]  # type: ignore[attr-defined]


def decisions(seed: int) -> list[tuple[str, bool, object, object]]:
    """Per instance not loading: (id, whether the simulator follows the plan to another
    model, the live heads, the simulated heads)."""
    rng = random.Random(seed)
    now_s = 1000.0
    sim = draw_state(rng, now_s)
    plan = random_plan(rng, sim)
    simulated = SimDispatch(sim, PRIORITY, members=10_000)  # type: ignore[arg-type]
    for request in sorted(sim.requests.values(), key=lambda r: r.arrival_at_s):
        simulated.arrived(request)
        simulated.queue(request)
    reports = {}
    for i, obs in sim.observations.items():
        profile = None if obs.model is None else sim.fleet.profile(obs.model, sim.fleet.instance(i))
        reports[i] = instance_status(i, obs, profile, 0.0, PRIORITY, now_s)
    out = []
    for instance in sim.fleet.instances:
        i = instance.id
        if sim.loading(i):
            continue  # the simulator's agents skip loading engines
        others = {k: r for k, r in reports.items() if k != i}
        view = ReportedFleet(sim.fleet, i, sim.observations[i], PRIORITY, others)
        live = AgentQueue(sim.fleet, i, PRIORITY)
        got = live.heads(plan, view, sim.requests.__contains__, now_s, sim.max_num_seqs(i))
        want = simulated.heads(plan, i, False)
        follows = bool(want) and want[0].model != sim.model_of(i)
        out.append((i, follows, names(got), names(want)))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_both_planes_decide_alike_on_one_state(seed: int) -> None:
    for instance_id, _, live, simulated in decisions(seed):
        assert live == simulated, f"instance {instance_id} decides otherwise live"


def test_the_states_exercise_both_rules() -> None:
    """The random states hold swaps the gate takes, and instances serving their model."""
    outcomes = [(follows, bool(heads)) for s in range(40) for _, follows, _, heads in decisions(s)]
    assert any(follows for follows, _ in outcomes)
    assert any(not follows and served for follows, served in outcomes)
