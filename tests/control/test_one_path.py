"""One control path: the live control loop (qlm/serve/loop.py) and the simulator's `qlm` policy
(qlm/sim/policies/qlm.py) are adapters around the same driver. Fed the same arrivals at the
same times, they publish the same plans (epoch, virtual queues, group members) at the same
times: inserts, violation checks, held-back and coalesced re-plans included."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from qlm.clock import Clock, VirtualClock
from qlm.config import ControlConfig, PlannerConfig, QlmConfig
from qlm.config.serve_config import ControllerConfig
from qlm.control.plan import PublishedPlan
from qlm.engine.engine_types import EngineObservation, EngineState
from qlm.queue.memory import MemoryQueue
from qlm.queue.records import InstanceStatus
from qlm.serve.loop import ControlLoop
from qlm.sim.policies.qlm import QlmPolicy, QlmVariant
from qlm.types import Fleet, Request
from tests.factories import make_instance, make_profile, make_request

INSTANCES = ("i0", "i1")
HORIZON_S = 30.0
Published = tuple[float, int, tuple[tuple[str, tuple[str, ...]], ...], tuple[tuple[str, ...], ...]]


def fleet() -> Fleet:
    return Fleet.of(
        [make_instance(i) for i in INSTANCES], [make_profile("m7b"), make_profile("m13b")]
    )


def config() -> QlmConfig:
    control = ControlConfig(tick_s=2.0, min_replan_interval_s=1.5)
    return QlmConfig(planner=PlannerConfig(policy="edf"), control=control)


def arrivals(seed: int) -> list[Request]:
    """Interactive and batch requests of two models (the second model fits no planned group
    until a re-plan), some arriving together, over HORIZON_S."""
    rng = random.Random(seed)
    at_s, out = 0.0, []
    for i in range(60):
        at_s += rng.choice((0.0, 0.0, 0.3, 0.7, 1.1))
        out.append(
            make_request(
                id=f"r{i:02d}",
                model=rng.choice(("m7b", "m7b", "m7b", "m13b")),
                slo_class=rng.choice(("interactive", "batch-1", "batch-2")),
                prompt_tokens=rng.randint(50, 2000),
                max_output_tokens=rng.randint(10, 500),
                arrival_at_s=round(at_s, 3),
            )
        )
    return out


def snapshot(at_s: float, plan: PublishedPlan) -> Published:
    queues = tuple(sorted((i, tuple(g)) for i, g in plan.queues.items()))
    members = tuple(plan.groups[g].request_ids for _, q in queues for g in q)
    return (round(at_s, 9), plan.epoch, queues, members)


def record(out: list[Published], at_s: float, plan: PublishedPlan | None) -> None:
    """The plan as it stands once everything at `at_s` is done (the live loop takes the
    arrivals of one instant in one round, the simulator one by one)."""
    if plan is None or (out and out[-1][1] == plan.epoch):
        return
    if out and out[-1][0] == round(at_s, 9):
        out.pop()
    out.append(snapshot(at_s, plan))


def run_live(requests: Sequence[Request]) -> list[Published]:
    """The live loop on a virtual clock: a round at each arrival and whenever the loop would
    wake by itself (its wait), as `ControlLoop.run` does with a queue that wakes it."""

    async def run() -> list[Published]:
        clock = VirtualClock(0.0)
        queue = MemoryQueue(clock=clock)
        loop = ControlLoop(config(), fleet(), queue, clock, ControllerConfig())
        pending = list(requests)
        out: list[Published] = []
        while clock.now_s() <= HORIZON_S:
            for instance_id in INSTANCES:
                await queue.report_instance(idle_status(instance_id, clock.now_s()))
            while pending and pending[0].arrival_at_s <= clock.now_s():
                await queue.enqueue(pending.pop(0))
            await loop.step()
            record(out, clock.now_s(), loop.driver.plan)
            wake_s = clock.now_s() + loop._wait_s()
            next_s = min(wake_s, pending[0].arrival_at_s) if pending else wake_s
            clock.advance_to(max(next_s, clock.now_s() + 1e-9))
        return out

    return asyncio.run(run())


def idle_status(instance_id: str, now_s: float) -> InstanceStatus:
    return InstanceStatus(instance_id, "ready", "m7b", 0.0, 0, 0, 100_000, now_s)


class Context:
    """A SimContext whose engines stay idle and never take work (as in the live run, where no
    agent pulls): the adapters differ only in how they feed the driver."""

    def __init__(self, policy: QlmPolicy) -> None:
        self.policy = policy
        self._fleet, self._config = fleet(), config()
        self._clock = VirtualClock(0.0)
        self._queued: dict[str, Request] = {}
        self._timers: list[tuple[float, int, str]] = []
        self._seq = itertools.count()

    @property
    def fleet(self) -> Fleet:
        return self._fleet

    @property
    def config(self) -> QlmConfig:
        return self._config

    @property
    def clock(self) -> Clock:
        return self._clock

    def queued(self) -> Mapping[str, Request]:
        return self._queued

    def observe(self, instance_id: str) -> EngineObservation:
        return EngineObservation(instance_id, EngineState.READY, "m7b", (), 0, 100_000, 0)

    def held(self, instance_id: str) -> int:
        return 0

    def model_of(self, instance_id: str) -> str | None:
        return "m7b"

    def loading(self, instance_id: str) -> bool:
        return False

    def serving(self, model: str) -> tuple[str, ...]:
        return tuple(i.id for i in self.fleet.instances)

    def max_num_seqs(self, instance_id: str) -> int:
        return 0

    def rng(self, component: str) -> np.random.Generator:
        return np.random.default_rng(0)

    def call_at(self, at_s: float, tag: str) -> None:
        heapq.heappush(self._timers, (at_s, next(self._seq), tag))

    def run(self, requests: Sequence[Request]) -> list[Published]:
        """Arrivals before timers at equal times, as the simulation runner orders them."""
        self.policy.start(self)
        pending = list(requests)
        out: list[Published] = []
        while pending or self._timers:
            timer_at_s = self._timers[0][0] if self._timers else float("inf")
            if pending and pending[0].arrival_at_s <= timer_at_s:
                request = pending.pop(0)
                self._clock.advance_to(request.arrival_at_s)
                self._queued[request.id] = request
                self.policy.on_arrival(request)
            else:
                at_s, _, tag = heapq.heappop(self._timers)
                if at_s > HORIZON_S:
                    break
                self._clock.advance_to(at_s)
                self.policy.on_timer(tag)
            record(out, self._clock.now_s(), self.policy.driver.plan)
        return out


def run_simulated(requests: Sequence[Request]) -> list[Published]:
    policy = QlmPolicy(QlmVariant(planning_latency_s=0.0))
    return Context(policy).run(requests)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_live_loop_and_simulator_publish_the_same_plans(seed: int) -> None:
    requests = arrivals(seed)
    live = run_live(requests)
    simulated = run_simulated(requests)
    assert len(live) > 10  # inserts and re-plans happened
    assert len({p[2] for p in live}) > 1  # more than one set of virtual queues
    assert live == simulated
