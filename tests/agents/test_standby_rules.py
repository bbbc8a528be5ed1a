"""A swap that sends the only warm copy of a sleeping model cold breaks that model's promises
(qlm/agents/standby_rules.py): the gate counts them, and a copy warm elsewhere costs nothing."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

import pytest

from qlm.agents.decision import Dispatcher
from qlm.agents.queued import QueuedItem
from qlm.agents.standby_rules import cold_drop_loss, goes_cold, idle_target
from qlm.types import Fleet
from tests.factories import make_instance, make_profile

PRIORITY = {"interactive": 1, "batch-1": 0}
LOAD_S, WAKE_S = 30.0, 2.0


@dataclass
class View:
    """A `FleetView` written out by hand: each instance's model and standby tier."""

    models: dict[str, str | None]
    tiers: dict[str, tuple[str, ...]]
    capacity: int = 1
    loading_ids: tuple[str, ...] = ()
    blocks: Mapping[str, float] = field(default_factory=dict)

    def model_of(self, instance_id: str) -> str | None:
        return self.models[instance_id]

    def serving(self, model: str) -> tuple[str, ...]:
        return tuple(i for i, m in self.models.items() if m == model and i not in self.loading_ids)

    def loading(self, model: str) -> tuple[str, ...]:
        return tuple(i for i in self.loading_ids if self.models[i] == model)

    def standby_models(self, instance_id: str) -> Collection[str]:
        return self.tiers.get(instance_id, ())

    def standby_capacity(self, instance_id: str) -> int:
        return self.capacity

    def blocks_of(self, instance_id: str) -> tuple[float, Mapping[str, float]]:
        return 10_000.0, self.blocks


def fleet() -> Fleet:
    profiles = [
        replace(make_profile(m, load_s=LOAD_S), wake_s=WAKE_S) for m in ("a", "b", "c", "d")
    ]
    return Fleet.of([make_instance(i, loaded_model=None) for i in ("i0", "i1")], profiles)


def dispatcher_with_b_traffic(now_s: float) -> Dispatcher:
    """b got a chat (10 s budget) every second for the last minute, and has three requests
    queued: due in 1 s (before even a wake ends), in 10 s (a wake saves it, a cold load does
    not) and in 100 s (either does)."""
    dispatcher = Dispatcher(fleet(), PRIORITY)
    for k in range(60):
        item = QueuedItem(f"old{k}", 100, 50, "interactive", now_s - 60 + k + 10, now_s - 60 + k)
        dispatcher.arrived("b", item)
    for rid, due_in_s in (("q1", 1.0), ("q10", 10.0), ("q100", 100.0)):
        item = QueuedItem(rid, 100, 50, "batch-1", now_s + due_in_s, now_s - 5.0)
        dispatcher.queues.add(item, "b")
    return dispatcher


def test_the_least_recently_served_sleeper_goes_cold_when_the_tier_is_full() -> None:
    view = View({"i0": "a", "i1": None}, {"i0": ("b", "d")}, capacity=2)
    assert goes_cold(view, "i0", "c") == ("d",)  # a sleeps first in line, b stays
    assert goes_cold(view, "i0", "d") == ()  # waking d frees its place for a
    view.capacity = 3
    assert goes_cold(view, "i0", "c") == ()  # room for a beside b and d
    view.capacity = 0
    assert goes_cold(view, "i0", "c") == ()  # no tier: a itself goes cold


def test_dropping_a_models_only_warm_copy_breaks_what_a_wake_would_keep() -> None:
    now_s = 1000.0
    dispatcher = dispatcher_with_b_traffic(now_s)
    view = View({"i0": "a", "i1": "d"}, {"i0": ("b",)})
    # arrivals over the 30 s cold load that cannot wait for it (all: 10 s budgets), less
    # those over the 2 s wake that cannot wait for it (none), plus the one queued request
    # a wake keeps and a cold load does not
    assert cold_drop_loss(dispatcher, view, "i0", "c", now_s) == pytest.approx(30.0 + 1.0)
    assert cold_drop_loss(dispatcher, view, "i0", "b", now_s) == 0.0  # a wake of b itself


@pytest.mark.parametrize(
    "elsewhere",
    [
        {"models": {"i0": "a", "i1": "b"}},  # served by i1
        {"models": {"i0": "a", "i1": "b"}, "loading_ids": ("i1",)},  # loading on i1
        {"models": {"i0": "a", "i1": "d"}, "tiers": {"i0": ("b",), "i1": ("b",)}},  # asleep
    ],
)
def test_a_copy_warm_elsewhere_costs_nothing_to_drop(elsewhere: dict[str, object]) -> None:
    now_s = 1000.0
    dispatcher = dispatcher_with_b_traffic(now_s)
    view = View(**{"tiers": {"i0": ("b",)}, **elsewhere})  # type: ignore[arg-type]
    assert cold_drop_loss(dispatcher, view, "i0", "c", now_s) == 0.0


def test_the_gate_keeps_a_full_tier_from_dropping_a_busy_models_only_copy() -> None:
    """i1 serves c, whose queue is deep enough (250 long batch requests due in 40-80 s) that
    a second instance keeps 22 more of its requests. i0 serves a, which has no traffic, and
    holds b asleep, b's only warm copy: moving i0 to c (a cold load) pays while b has no
    traffic, and not when b's chats, which a wake would serve and a cold load would not,
    outnumber c's gain."""
    now_s = 1000.0
    for b_busy in (False, True):
        dispatcher = dispatcher_with_b_traffic(now_s) if b_busy else Dispatcher(fleet(), PRIORITY)
        dispatcher.arrived("a", QueuedItem("a0", 10, 10, "interactive", 0.0, 0.0))
        for k in range(250):
            due_at_s = now_s + 40.0 + k * 40.0 / 250
            item = QueuedItem(f"c{k}", 1000, 400, "batch-1", due_at_s, now_s - 1.0)
            dispatcher.queues.add(item, "c")
        view = View({"i0": "a", "i1": "c"}, {"i0": ("b",), "i1": ()})
        assert dispatcher.swap_pays(view, "c", "i0", now_s) is not b_busy


def idle_i0(tiers: dict[str, tuple[str, ...]], capacity: int) -> tuple[Dispatcher, View]:
    """i0 serves a, with nothing of it queued and no traffic; i1 serves d; three batch
    requests of b and one of c are queued, due in 100 s (a cold load keeps them)."""
    now_s = 1000.0
    dispatcher = Dispatcher(fleet(), PRIORITY)
    dispatcher.arrived("a", QueuedItem("a0", 10, 10, "interactive", 0.0, 0.0))
    for rid, model in (("b1", "b"), ("b2", "b"), ("b3", "b"), ("c1", "c")):
        item = QueuedItem(rid, 100, 50, "batch-1", now_s + 100.0, now_s - 5.0)
        dispatcher.queues.add(item, model)
    return dispatcher, View({"i0": "a", "i1": "d"}, tiers, capacity)


def test_an_idle_instance_with_no_tier_loads_the_most_queued_model_no_one_holds() -> None:
    dispatcher, view = idle_i0({}, capacity=0)
    assert idle_target(dispatcher, view, "i0", 1000.0) == "b"
    # ... not a model asleep in another instance's tier (woken there), nor with its own
    # model's requests queued
    dispatcher, view = idle_i0({"i1": ("b",)}, capacity=0)
    assert idle_target(dispatcher, view, "i0", 1000.0) == "c"
    dispatcher.queues.add(QueuedItem("a1", 10, 10, "interactive", 1010.0, 999.0), "a")
    assert idle_target(dispatcher, view, "i0", 1000.0) is None


def test_an_idle_instance_with_a_tier_wakes_but_loads_nothing_cold() -> None:
    """With a tier, a model no instance holds comes in by a fetch and a wake (warming.py)."""
    dispatcher, view = idle_i0({"i0": ("c",)}, capacity=1)
    assert idle_target(dispatcher, view, "i0", 1000.0) == "c"  # the sleeper, though b has more
    dispatcher, view = idle_i0({}, capacity=1)
    assert idle_target(dispatcher, view, "i0", 1000.0) is None
