"""Hysteresis and drains of the autoscaler's decisions (qlm/autoscale/replicas.py)."""

from __future__ import annotations

import random

from qlm.autoscale.need import Pool, PoolNeed
from qlm.autoscale.replicas import Autoscaler
from qlm.config import AutoscaleConfig
from tests.factories import make_instance

POOL = Pool("p", tuple(make_instance(f"p-{k}") for k in range(6)), 1, 1.0)
CONFIG = AutoscaleConfig(scale_down_stabilization_s=60.0, drain_timeout_s=120.0)


def need(replicas: int) -> dict[str, PoolNeed]:
    return {"p": PoolNeed("p", float(replicas), replicas, (), ())}


def test_up_at_once_down_after_the_window() -> None:
    scaler = Autoscaler(CONFIG, [POOL], {"p": 2})
    (up,) = scaler.decide(0.0, need(5), {})
    assert (up.desired, up.replicas) == (5, 5)
    (held,) = scaler.decide(30.0, need(2), {})
    assert held.replicas == 5
    assert held.draining == ()
    (down,) = scaler.decide(61.0, need(2), {})
    assert (down.desired, down.replicas) == (2, 2)
    (floor,) = scaler.decide(200.0, need(0), {})
    assert floor.replicas == 1  # min_replicas
    (ceiling,) = scaler.decide(201.0, need(50), {})
    assert ceiling.replicas == 6  # max_replicas


def test_scale_down_waits_for_busy_instances_to_drain() -> None:
    scaler = Autoscaler(CONFIG, [POOL], {"p": 4})
    (first,) = scaler.decide(0.0, need(2), {"p-3": True})
    # the window holds only this need: desired 2, but p-3 still works
    assert first.desired == 2
    assert first.replicas == 4
    assert first.draining == ("p-2", "p-3")
    (still,) = scaler.decide(10.0, need(2), {"p-3": True})
    assert still.replicas == 4
    assert still.draining == ("p-2", "p-3")
    (done,) = scaler.decide(20.0, need(2), {"p-3": False})
    assert done.replicas == 2
    assert done.draining == ()


def test_a_returning_load_cancels_the_drain() -> None:
    scaler = Autoscaler(CONFIG, [POOL], {"p": 4})
    (draining,) = scaler.decide(0.0, need(2), {"p-2": True})
    assert draining.draining == ("p-2", "p-3")
    (back,) = scaler.decide(5.0, need(4), {"p-2": True})
    assert back.replicas == 4
    assert back.draining == ()


def test_a_stuck_instance_is_removed_after_the_drain_timeout() -> None:
    scaler = Autoscaler(CONFIG, [POOL], {"p": 3})
    (first,) = scaler.decide(0.0, need(2), {"p-2": True})
    assert first.replicas == 3
    (timed_out,) = scaler.decide(121.0, need(2), {"p-2": True})
    assert timed_out.replicas == 2


def test_random_rounds_never_drop_a_busy_instance_early() -> None:
    rng = random.Random(3)
    scaler = Autoscaler(CONFIG, [POOL], {"p": 1})
    draining_since: dict[str, float] = {}
    replicas = 1
    for step in range(2000):
        now_s = step * 5.0
        busy = {i.id: rng.random() < 0.6 for i in POOL.instances}
        (d,) = scaler.decide(now_s, need(rng.randrange(0, 8)), busy)
        assert POOL.min_replicas <= d.replicas <= POOL.max_replicas
        if d.replicas < replicas:  # instances d.replicas.. are removed now
            for i in POOL.instances[d.replicas : replicas]:
                waited = now_s - draining_since.get(i.id, now_s)
                assert not busy[i.id] or waited >= CONFIG.drain_timeout_s
                if busy[i.id]:  # announced as draining in an earlier round
                    assert i.id in draining_since
        draining_since = {i: draining_since.get(i, now_s) for i in d.draining}
        replicas = d.replicas
