"""What sleeps where: which model an instance fetches into its standby tier while it serves.

Question answered: a swap to a model asleep on the instance is a wake (the profile's wake_s,
a second or two), to any other a cold load (load_s, tens of seconds), and the standby tier
holds only what the instance served last. Which models should it keep warm instead? Those a
cold load would cost the most: a model's worth on an instance is the urgent arrivals (TTFT
budget shorter than the load) a cold load of it would leave without an instance, less those
a wake would (`ArrivalRates.at_risk` over each), shared among the instances that can serve
it (a 70B model only a few instances can hold is worth more to each of them than a 7B model
any instance can wake). The fleet's tiers are one store: to this tier a model's worth is also
shared with the instances that hold it already (serving, loading, asleep or fetched:
`copies_of`), so the tiers cover the tail models before they hold a third copy of a popular
one. `standby_fetch` names the next fetch: into a free place, the worthiest model the tier
lacks among the `capacity` worthiest by that share; when the tier is full, a model held
nowhere in the fleet takes the place of the least worthy model the tier holds that another
instance holds too. It never replaces a model's only copy: replacing by worth alone (what
the instance served gives way to worthier models) starved the tail models the tier held;
replacing a second copy by a model held nowhere only widens what the fleet can wake. One
fetch at a time, none while loading. Rates move, so worths are taken afresh each time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Protocol

from qlm.agents.actions import FetchStandby
from qlm.agents.arrival_rates import ArrivalRates
from qlm.engine.engine_types import EngineState
from qlm.types import Fleet, Instance


class TierReport(Protocol):
    """What the fetch decision reads of an instance: an EngineObservation (the simulator)
    or an agent's InstanceStatus (the live control loop)."""

    @property
    def instance_id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def standby_models(self) -> tuple[str, ...]: ...
    @property
    def fetching_models(self) -> tuple[str, ...]: ...
    @property
    def standby_capacity(self) -> int: ...


def standby_worths(
    fleet: Fleet, instance: Instance, rates: ArrivalRates, now_s: float, hosts: Mapping[str, int]
) -> dict[str, float]:
    """Model -> its worth asleep on the instance (module docstring); models that cannot wake
    faster than they load, or that nothing urgent asks for, are left out."""
    worths = {}
    for model, count in hosts.items():
        profile = fleet.profile(model, instance)
        if profile is None or profile.wake_s is None or not fleet.can_serve(instance, model):
            continue
        saved = rates.saved_by_wake(model, now_s, (profile.wake_s, profile.load_s))
        if saved > 0:
            worths[model] = saved / max(1, count)
    return worths


def hosts_of(fleet: Fleet, models: Iterable[str]) -> dict[str, int]:
    """Model -> how many of the fleet's instances can serve it."""
    return {m: sum(fleet.can_serve(i, m) for i in fleet.instances) for m in models}


def copies_of(observations: Iterable[TierReport]) -> Counter[str]:
    """Model -> on how many instances it is served, loading, asleep or being fetched."""
    copies: Counter[str] = Counter()
    for obs in observations:
        held = {*obs.standby_models, *obs.fetching_models}
        if obs.model is not None:
            held.add(obs.model)
        copies.update(held)
    return copies


def standby_fetch(
    obs: TierReport, worths: Mapping[str, float], copies: Mapping[str, int]
) -> FetchStandby | None:
    """The fetch the instance should start now, if any (module docstring). `copies`: on how
    many of the fleet's instances each model is served, loading, asleep or fetched."""
    capacity = obs.standby_capacity
    if capacity == 0 or obs.fetching_models or obs.state == EngineState.LOADING:
        return None
    mine = obs.standby_models

    def elsewhere(model: str) -> int:
        return copies.get(model, 0) - (model in mine) - (model == obs.model)

    def share(model: str) -> float:
        return worths[model] / (1 + elsewhere(model))

    ranked = sorted((m for m in worths if m != obs.model), key=lambda m: (-share(m), m))
    if len(mine) < capacity:
        missing = [m for m in ranked[:capacity] if m not in mine]
        return FetchStandby(obs.instance_id, missing[0]) if missing else None
    uncovered = [m for m in ranked if copies.get(m, 0) == 0]
    spare = [m for m in mine if elsewhere(m) > 0]
    if not uncovered or not spare:
        return None
    victim = min(spare, key=lambda m: (share(m) if m in worths else 0.0, m))
    return FetchStandby(obs.instance_id, uncovered[0], replacing=victim)


def fleet_fetches(
    fleet: Fleet,
    reports: Iterable[TierReport],
    rates: ArrivalRates,
    now_s: float,
    hosts: Mapping[str, int],
) -> tuple[FetchStandby, ...]:
    """The fetches every tiered instance of the fleet should start now, decided in turn so
    that two tiers do not fetch the same model at once; worths are taken once per instance
    shape (GPU type, count, memory: the same profiles fit). `reports`: every instance up."""
    reports = list(reports)
    copies = copies_of(reports)
    worths: dict[tuple[str, int, int], dict[str, float]] = {}
    fetches = []
    for report in reports:
        if report.standby_capacity == 0:
            continue
        instance = fleet.instance(report.instance_id)
        shape = (instance.gpu_type, instance.gpu_count, instance.gpu_memory_bytes)
        if shape not in worths:
            worths[shape] = standby_worths(fleet, instance, rates, now_s, hosts)
        fetch = standby_fetch(report, worths[shape], copies)
        if fetch is not None:
            fetches.append(fetch)
            copies[fetch.model] += 1
            if fetch.replacing is not None:
                copies[fetch.replacing] -= 1
    return tuple(fetches)
