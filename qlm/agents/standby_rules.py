"""The models asleep in an instance's standby tier, in the one dispatch decision
(qlm/agents/decision.py): what a swap costs them, and when an idle instance wakes one, or,
with no tier, loads a model no instance holds.

**What a swap costs them** (`cold_drop_loss`, added by `swap_pays` to the promises a swap
breaks). The model an instance leaves goes to sleep in its tier, first in line; when the tier
is full, the least recently served sleeping model goes cold (qlm/engine/model/tiers.py; a
wake of the target frees the target's own place first). A model warm elsewhere (serving,
loading, or asleep in another instance's tier) loses nothing by it. A model whose only warm
copy this was comes back with a cold load where a wake would have done: its queued requests
due between the wake and the cold load are broken, and so are its arrivals that could wait
for the wake but not for the load (`ArrivalRates.saved_by_wake`). Without it a cold swap was priced
by the instance's own model and the target only (many:5: a model's only warm copy dropped,
its queued requests then waited a minute for a cold load elsewhere).

**When an idle instance wakes one** (`idle_target`, rule 1b of the decision). The plan names
the model an instance goes to next; the swap gate may refuse it (the cost above, among
others), and the plan may keep the instance on a model with nothing queued. Either way the
instance would idle while a model asleep in its own tier, served by no instance, has requests
waiting: the planner kept proposing tail models to such an instance, the gate refused each
for the sleeping model's sake, and that model's requests waited until all were late (many:6).
So an instance with nothing of its model queued wakes the sleeping model with the most
queued requests that no instance serves or loads, when the wake pays (`swap_pays`).

**When an idle instance with no tier loads one** (`idle_target`, rule 1c). The same gap
without a tier: the plan sends a model no instance holds to one instance, the gate refuses
that instance (its own model's arrivals), and another instance idles beside it. So an
instance with no tier and nothing of its model queued loads, cold, the model it can hold with
the most queued requests that no instance holds warm (serving, loading or asleep anywhere:
that one is woken where it sleeps), when the load pays, as the plan's move would be priced.
In a tiered fleet such a model comes in by a fetch into a tier and a wake (warming.py), which
takes no instance away: in an experiment that applied rule 1c there too, the 11 tiered
many-model cases lost 0.33 points on average over the control loop's timing
(benchmarks/timing_mean.py; 3 up, 5 down, by up to 1.8), while the untiered ones gained up to
1.1 points (`qlm simulate sims/many-quick.yaml --seed 0 --policy qlm`: 72.1 -> 73.1 %).

Both planes read it through their `FleetView`: the simulator's exact tiers, the live agent's
own engine and the other agents' reports (their standby models, most recently served first);
the live agent keeps the queued requests of its tier's models in the decision's queue for it
(qlm/agents/live_queue.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from qlm.agents.arrival_rates import ArrivalRates, Side
from qlm.agents.fleet_view import FleetView
from qlm.agents.model_queues import ModelQueues
from qlm.types import Fleet


class Decision(Protocol):
    """What these rules read of the decision's state (`decision.Dispatcher`, which calls
    them: declared here rather than imported, so the modules import one way only)."""

    fleet: Fleet
    queues: ModelQueues
    arrivals: ArrivalRates

    def swap_pays(self, view: FleetView, target: str, instance_id: str, now_s: float) -> bool:
        """`Dispatcher.swap_pays`."""
        ...


def goes_cold(view: FleetView, instance_id: str, target: str) -> tuple[str, ...]:
    """The sleeping models a swap of the instance to `target` drops from its standby tier:
    the target wakes (leaves the tier), the model left goes to sleep first in line, and what
    is past the capacity goes cold. None without a tier: there the model left goes cold
    itself, which `swap_pays` prices as its way back."""
    capacity = view.standby_capacity(instance_id)
    if capacity <= 0:
        return ()
    tier = [m for m in view.standby_models(instance_id) if m != target]
    return tuple(tier[capacity - 1 :])


def warm_elsewhere(dispatcher: Decision, view: FleetView, model: str, instance_id: str) -> bool:
    """Whether an instance other than `instance_id` serves, loads or holds `model` asleep."""
    if view.serving(model) or view.loading(model):
        return True
    return any(
        model in view.standby_models(i.id)
        for i in dispatcher.fleet.instances
        if i.id != instance_id
    )


def cold_drop_loss(
    dispatcher: Decision,
    view: FleetView,
    instance_id: str,
    target: str,
    now_s: float,
    side: Side = Side.POINT,
) -> float:
    """Promises a swap of the instance to `target` breaks by sending the only warm copy of
    sleeping models cold: per such model, its queued requests due from a wake's end to a
    cold load's, and its expected arrivals at risk over the cold load less those at risk
    over the wake (read as `side` says)."""
    fleet = dispatcher.fleet
    instance = fleet.instance(instance_id)
    arrivals = dispatcher.arrivals
    broken = 0.0
    for gone in goes_cold(view, instance_id, target):
        profile = fleet.profile(gone, instance)
        if profile is None or warm_elsewhere(dispatcher, view, gone, instance_id):
            continue
        wake_s, cold_s = profile.load_time_s(True), profile.load_s
        if cold_s <= wake_s:
            continue  # no faster way back asleep than cold: nothing lost by the drop
        queued = dispatcher.queues.items(gone).values()
        broken += sum(now_s + wake_s <= item.ttft_deadline_at_s < now_s + cold_s for item in queued)
        broken += arrivals.saved_by_wake(gone, now_s, (wake_s, cold_s), side)
    return broken


def idle_target(
    dispatcher: Decision, view: FleetView, instance_id: str, now_s: float
) -> str | None:
    """Rules 1b and 1c: the model an instance moves to on its own when it follows no plan to
    another model and has nothing of its own model queued. 1b: of the sleeping models in its
    tier with queued requests that no instance serves or loads, the one with the most (the
    most recently served first among equals), if its wake pays (`swap_pays`). 1c, on an
    instance with no standby tier: of the models it can hold with queued requests that no
    instance holds warm (`warm_elsewhere`), the one with the most (by name among equals), if
    its cold load pays. None otherwise."""
    model = view.model_of(instance_id)
    queues = dispatcher.queues
    if model is None or queues.count(model) > 0:
        return None
    asleep = _most_queued(queues, view, view.standby_models(instance_id))
    if asleep is not None and dispatcher.swap_pays(view, asleep, instance_id, now_s):
        return asleep
    if view.standby_capacity(instance_id) > 0:
        return None  # a tiered fleet brings a model no instance holds by fetch and wake
    fleet = dispatcher.fleet
    instance = fleet.instance(instance_id)
    # Most queued first, by name among equals; whether a model is warm elsewhere (a look at
    # every instance's tier) is asked only of the candidates reached.
    for cold in sorted(queues.models(), key=lambda m: (-queues.count(m), m)):
        if queues.count(cold) == 0:
            break
        if cold == model or view.serving(cold) or view.loading(cold):
            continue
        if fleet.can_serve(instance, cold) and not warm_elsewhere(
            dispatcher, view, cold, instance_id
        ):
            return cold if dispatcher.swap_pays(view, cold, instance_id, now_s) else None
    return None


def _most_queued(queues: ModelQueues, view: FleetView, models: Iterable[str]) -> str | None:
    """Of `models`, the first with the most queued requests that no instance serves or
    loads (None: none has any)."""
    best, most = None, 0
    for candidate in models:
        count = queues.count(candidate)
        if count > most and not view.serving(candidate) and not view.loading(candidate):
            best, most = candidate, count
    return best
