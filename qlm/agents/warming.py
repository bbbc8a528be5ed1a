"""What sleeps where: which model an instance fetches into its standby tier while it serves.

Question answered: a swap to a model asleep on the instance is a wake (the profile's wake_s,
a second or two), to any other a cold load (load_s, tens of seconds), and the standby tier
holds only what the instance served last. Which models should it keep warm instead? Those a
cold load would cost the most: a model's worth on an instance is the urgent arrivals (TTFT
budget shorter than the load) a cold load of it would leave without an instance, less those
a wake would (`ArrivalRates.at_risk` over each), shared among the instances that can serve
it (a 70B model only a few instances can hold is worth more to each of them than a 7B model
any instance can wake). `standby_fetch` names the next fetch: the worthiest model the tier
lacks among the `capacity` worthiest, into a free place only (what the instance served keeps
its place: replacing it with worthier models starved the tail models the tier held); one
fetch at a time, none while loading. Rates move, so worths are taken afresh each time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from qlm.agents.actions import FetchStandby
from qlm.agents.arrival_rates import ArrivalRates
from qlm.engine.types import EngineObservation, EngineState
from qlm.types import Fleet, Instance


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
        saved = rates.at_risk(model, now_s, profile.load_s) - rates.at_risk(
            model, now_s, profile.wake_s
        )
        if saved > 0:
            worths[model] = saved / max(1, count)
    return worths


def hosts_of(fleet: Fleet, models: Iterable[str]) -> dict[str, int]:
    """Model -> how many of the fleet's instances can serve it."""
    return {m: sum(fleet.can_serve(i, m) for i in fleet.instances) for m in models}


def standby_fetch(obs: EngineObservation, worths: Mapping[str, float]) -> FetchStandby | None:
    """The fetch the instance should start now, if any (module docstring)."""
    capacity = obs.standby_capacity
    full = len(obs.standby_models) >= capacity
    if full or obs.fetching_models or obs.state is EngineState.LOADING:
        return None
    ranked = sorted((m for m in worths if m != obs.model), key=lambda m: (-worths[m], m))
    missing = [m for m in ranked[:capacity] if m not in obs.standby_models]
    return FetchStandby(obs.instance_id, missing[0]) if missing else None
