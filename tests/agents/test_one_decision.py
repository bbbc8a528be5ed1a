"""One decision, two planes: the simulator's input builder (`SimDispatch`, over the simulation's
exact state) and the live agent's (`AgentQueue` over `ReportedFleet`: its own engine and the
other agents' status reports) are given one queue and fleet state, and must decide alike for
every instance: whether it follows the plan to another model, and what it serves next."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from qlm.agents.agent_reports import instance_status
from qlm.agents.live_queue import AgentQueue
from qlm.agents.reported_fleet import ReportedFleet
from qlm.agents.standby_rules import goes_cold, warm_elsewhere
from qlm.clock import VirtualClock
from qlm.config import QlmConfig
from qlm.control.plan import PublishedPlan, planned_group
from qlm.engine.engine_types import EngineObservation, EngineRequest, EngineState
from qlm.queue.records import InstanceStatus
from qlm.sim.policies.qlm_dispatch import SimDispatch
from qlm.types import Fleet, Request
from tests.factories import make_instance, make_profile, make_request

MODELS = ("m7b", "m13b", "m7c")
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
    """Four instances, three models, each instance serving, loading or empty, with admitted
    work of random classes and a standby tier of 0-2 models with some asleep (a swap may send
    the only warm copy of one cold: qlm/agents/standby_rules.py); 0-120 queued requests per model
    that arrived over the last minute."""
    ids = [f"i{k}" for k in range(4)]
    fleet = Fleet.of(
        [make_instance(i, loaded_model=None) for i in ids],
        [
            replace(make_profile("m7b", load_s=8.0), wake_s=1.0),
            replace(make_profile("m13b", weight_gib=26.0, load_s=15.0), wake_s=2.0),
            replace(make_profile("m7c", load_s=8.0), wake_s=1.0),
        ],
    )
    state: dict[str, tuple[str | None, bool]] = {}
    observations = {}
    for i in ids:
        model = rng.choice((*MODELS[:2], *MODELS[:2], None))  # m7c: asleep at most
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
        capacity = rng.choice((0, 1, 2))
        asleep = [m for m in MODELS if m != model and rng.random() < 0.3][:capacity]
        observations[i] = EngineObservation(
            i, engine_state, model, admitted, sum(r.context_tokens for r in admitted),
            400_000, 64, at_s=now_s, standby_models=tuple(asleep), standby_capacity=capacity,
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


def status_reports(sim: FakeSim, now_s: float) -> dict[str, InstanceStatus]:
    """Every instance's status report, as its agent writes it."""
    reports = {}
    for i, obs in sim.observations.items():
        profile = None if obs.model is None else sim.fleet.profile(obs.model, sim.fleet.instance(i))
        reports[i] = instance_status(i, obs, profile, 0.0, PRIORITY, now_s)
    return reports


def decisions(seed: int) -> list[tuple[str, bool, object, object]]:
    """Per instance not loading: (id, whether the simulator follows the plan to another
    model, the live heads, the simulated heads)."""
    rng = random.Random(seed)
    now_s = 1000.0
    sim = draw_state(rng, now_s)
    return decide(sim, random_plan(rng, sim), now_s)


def decide(
    sim: FakeSim, plan: PublishedPlan, now_s: float
) -> list[tuple[str, bool, object, object]]:
    """`decisions` of one state and plan."""
    simulated = SimDispatch(sim, PRIORITY, members=10_000)  # type: ignore[arg-type]
    for request in sorted(sim.requests.values(), key=lambda r: r.arrival_at_s):
        simulated.arrived(request)
        simulated.queue(request)
    reports = status_reports(sim, now_s)
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


def test_both_views_see_the_same_standby_drops() -> None:
    """Which sleeping models a swap sends cold, and whether each is warm on another instance
    (qlm/agents/standby_rules.py), read alike off the simulator's exact tiers and the live
    agent's own engine and peers' reports; the states hold drops of a model's only warm
    copy as well as of one warm elsewhere."""
    seen = set()
    for seed in range(40):
        sim = draw_state(random.Random(seed), 1000.0)
        simulated = SimDispatch(sim, PRIORITY, members=10_000)  # type: ignore[arg-type]
        reports = status_reports(sim, 1000.0)
        for instance in sim.fleet.instances:
            i = instance.id
            others = {k: r for k, r in reports.items() if k != i}
            view = ReportedFleet(sim.fleet, i, sim.observations[i], PRIORITY, others)
            for target in MODELS:
                drops = [
                    [(m, warm_elsewhere(simulated.decision, plane, m, i)) for m in gone]
                    for plane in (view, simulated)
                    for gone in [goes_cold(plane, i, target)]
                ]
                assert drops[0] == drops[1], (seed, i, target)
                seen.update(warm for _, warm in drops[0])
    assert seen == {True, False}


def test_an_idle_instance_wakes_the_sleeping_model_no_instance_serves() -> None:
    """i0 serves m7b with nothing of it queued and holds m7c asleep, its only warm copy, with
    ten batch requests of m7c queued; the plan sends i0 to m13b, which two instances serve
    already, and m7c's groups to i1. Both planes refuse the move to m13b (it keeps nothing
    more of m13b, and a cold load there would drop m7c from the tier) and wake m7c instead
    (`idle_target`, qlm/agents/standby_rules.py): before, i0 idled on m7b while m7c waited."""
    now_s = 1000.0
    sim = draw_state(random.Random(0), now_s)
    sim.requests.clear()
    for i, model, asleep in (("i0", "m7b", ("m7c",)), ("i1", "m13b", ()), ("i2", "m13b", ()),
                             ("i3", "m7b", ())):  # fmt: skip
        sim.state[i] = (model, False)
        sim.observations[i] = EngineObservation(
            i, EngineState.READY, model, (), 0, 400_000, 64, at_s=now_s,
            standby_models=asleep, standby_capacity=len(asleep),
        )  # fmt: skip
    chats = [make_request(model="m13b", arrival_at_s=now_s - 2.0, ttft_s=20.0) for _ in range(2)]
    batch = [
        make_request(model="m7c", slo_class="batch-1", arrival_at_s=now_s - 5.0 - k, ttft_s=60.0)
        for k in range(10)
    ]
    sim.requests.update({r.id: r for r in (*chats, *batch)})
    groups = {"g13": planned_group("g13", "m13b", chats), "g7c": planned_group("g7c", "m7c", batch)}
    queues = {"i0": ("g13",), "i1": ("g7c",), "i2": (), "i3": ()}
    plan = PublishedPlan(1, now_s, queues, groups)
    heads = {i: (live, simulated) for i, _, live, simulated in decide(sim, plan, now_s)}
    live, simulated = heads["i0"]
    assert live == simulated
    assert [model for model, _ in simulated] == ["m7c"]
    assert sorted(simulated[0][1]) == sorted(r.id for r in batch)


def test_an_idle_instance_with_no_tier_loads_the_model_no_instance_holds() -> None:
    """No standby tiers. i0 serves m7b, which i3 serves too, with nothing of it queued; the
    plan sends m7c's two batch requests (a model no instance holds) to i1, m13b's only
    instance, whose two queued chats the move would break: the gate refuses it. Both planes
    then load m7c on i0, which breaks nothing (`idle_target`'s rule 1c,
    qlm/agents/standby_rules.py): before, i0 idled beside the refused plan and m7c waited."""
    now_s = 1000.0
    sim = draw_state(random.Random(0), now_s)
    sim.requests.clear()
    for i, model in (("i0", "m7b"), ("i1", "m13b"), ("i2", None), ("i3", "m7b")):
        sim.state[i] = (model, False)
        sim.observations[i] = EngineObservation(
            i, EngineState.READY, model, (), 0, 400_000, 64, at_s=now_s
        )
    chats = [make_request(model="m13b", arrival_at_s=now_s - 2.0, ttft_s=20.0) for _ in range(2)]
    batch = [
        make_request(model="m7c", slo_class="batch-1", arrival_at_s=now_s - 5.0 - k, ttft_s=60.0)
        for k in range(2)
    ]
    sim.requests.update({r.id: r for r in (*chats, *batch)})
    groups = {"g13": planned_group("g13", "m13b", chats), "g7c": planned_group("g7c", "m7c", batch)}
    queues = {"i0": (), "i1": ("g7c",), "i2": (), "i3": ()}
    plan = PublishedPlan(1, now_s, queues, groups)
    heads = {i: (live, simulated) for i, _, live, simulated in decide(sim, plan, now_s)}
    for i in ("i0", "i1"):
        assert heads[i][0] == heads[i][1], i
    assert [model for model, _ in heads["i1"][1]] == ["m13b"]  # the plan's move refused
    assert [model for model, _ in heads["i0"][1]] == ["m7c"]
    assert sorted(heads["i0"][1][0][1]) == sorted(r.id for r in batch)
