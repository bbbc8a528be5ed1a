"""How many instances each pool needs: the autoscaling LSO, from the estimator's own rates.

Question answered: given the recent arrival rate per model (qlm/autoscale/demand.py), the queued
backlog with its deadlines and the profiles, how many instances of each pool (one GPU type)
keep the promises? Pure: every call carries `now_s`.

One request of a model on a pool's instance occupies `request_work_s` of it: its prefill plus
its share of the batch's decode iterations (the estimator's occupancy, qlm/estimator/rwt.py).
A model then needs, on a pool,

* forecast: rate x work / target_utilization instances, and
* backlog: the densest deadline prefix of its queued requests, max_k W_k / (d_k - now), where
  W_k is the work of the k requests due first and d_k the k-th deadline (EDF's feasibility
  bound); a deadline sooner than the pool's load time counts as that load time, since no new
  instance could help earlier.

A model whose requests cannot wait for a load (a TTFT budget shorter than the pool's load
time: the wake time where the pool's engines keep models asleep, else the cold load) must stay
resident: its need is rounded up to whole instances. The other models share instances through
swaps: their needs add up before rounding; those that can wait for a wake but not for a cold
load must stay warm (loaded or asleep), so the pool keeps enough instances to hold them all
(one loaded and `standby_slots` asleep each). Models are placed on the pool where a request costs
least (cost per hour x work), the largest need first; what a full pool cannot take goes to the
next cheapest; what no pool can take is reported as unmet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qlm.autoscale.demand import ModelDemand
from qlm.config import AutoscaleConfig
from qlm.perf.profile import Profile
from qlm.types import Fleet, Instance, Request


@dataclass(frozen=True, slots=True)
class Pool:
    """A pool's instances in ordinal order (max_replicas of them; scale-down removes the
    last ones first) and what one instance costs."""

    name: str
    instances: tuple[Instance, ...]
    min_replicas: int
    cost_per_hour: float
    # Models each instance keeps asleep (the standby tier, qlm/engine/model/tiers.py): one that
    # slept there comes back in the profile's wake_s instead of its cold load_s.
    standby_slots: int = 0

    @property
    def max_replicas(self) -> int:
        return len(self.instances)


@dataclass(frozen=True, slots=True)
class PoolNeed:
    pool: str
    units: float  # instances the demand needs, before rounding
    replicas: int  # rounded (resident models whole), within [min_replicas, max_replicas]
    resident: tuple[str, ...]  # models that must keep an instance here
    shared: tuple[str, ...]  # models placed here that share instances by swapping
    warm: tuple[str, ...] = ()  # shared models that must stay loaded or asleep here
    unmet_units: float = 0.0  # demand no pool had room for (reported on every pool)


def request_work_s(
    profile: Profile, instance: Instance, prompt_tokens: float, output_tokens: float
) -> float:
    """Instance time one request takes: prefill plus its share of the batch's decode steps."""
    output = min(profile.output_tokens_mean, output_tokens)
    batch = profile.batch_size_for(instance.gpu_memory_bytes, prompt_tokens + output)
    return profile.prefill_s(prompt_tokens) + output * profile.decode_step_s_at(batch) / batch


def backlog_units(
    queued: Sequence[Request],
    profile: Profile,
    instance: Instance,
    now_s: float,
    load_s: float | None = None,
) -> float:
    """Instances that clear a model's queued requests by their TTFT deadlines (EDF bound);
    a deadline sooner than `load_s` (default: the profile's cold load) counts as that."""
    floor_s = max(profile.load_s if load_s is None else load_s, 1e-3)
    work_s, units = 0.0, 0.0
    for r in sorted(queued, key=lambda r: r.ttft_deadline_at_s):
        work_s += request_work_s(profile, instance, r.prompt_tokens, r.max_output_tokens)
        units = max(units, work_s / max(r.ttft_deadline_at_s - now_s, floor_s))
    return units


@dataclass(frozen=True, slots=True)
class _Need:
    model: str
    units: dict[str, float]  # pool -> instances needed if all of it went there
    resident: dict[str, bool]  # pool -> must stay resident there
    warm: dict[str, bool]  # pool -> must stay loaded or asleep there (woken in time)


def _model_need(
    pools: Sequence[Pool],
    fleet: Fleet,
    demand: ModelDemand | None,
    queued: Sequence[Request],
    now_s: float,
    config: AutoscaleConfig,
) -> _Need | None:
    model = demand.model if demand is not None else queued[0].model
    units: dict[str, float] = {}
    resident: dict[str, bool] = {}
    warm: dict[str, bool] = {}
    for pool in pools:
        template = pool.instances[0]
        profile = fleet.profile(model, template)
        if profile is None or not fleet.can_serve(template, model):
            continue
        load_s = profile.load_time_s(pool.standby_slots > 0)
        need = backlog_units(queued, profile, template, now_s, load_s)
        budget_s = math.inf if demand is None else demand.ttft_budget_min_s
        if demand is not None:
            work = request_work_s(
                profile, template, demand.prompt_tokens_mean, demand.output_cap_mean
            )
            need += demand.rate_per_s * work
        resident[pool.name] = budget_s < load_s
        warm[pool.name] = load_s <= budget_s < profile.load_s
        units[pool.name] = need / config.target_utilization
    return _Need(model, units, resident, warm) if units else None


def pool_needs(
    pools: Sequence[Pool],
    fleet: Fleet,
    demands: Sequence[ModelDemand],
    queued: Sequence[Request],
    now_s: float,
    config: AutoscaleConfig,
) -> dict[str, PoolNeed]:
    """Each pool's need for the demand and the backlog (module docstring)."""
    by_model: dict[str, list[Request]] = {}
    for r in queued:
        by_model.setdefault(r.model, []).append(r)
    forecast = {d.model: d for d in demands}
    needs = [
        n
        for m in sorted(set(forecast) | set(by_model))
        if (n := _model_need(pools, fleet, forecast.get(m), by_model.get(m, []), now_s, config))
    ]
    return _place(pools, needs)


def _place(pools: Sequence[Pool], needs: Sequence[_Need]) -> dict[str, PoolNeed]:
    cost = {p.name: p.cost_per_hour for p in pools}
    room = {p.name: float(p.max_replicas) for p in pools}
    resident_units: dict[str, float] = {p.name: 0.0 for p in pools}
    shared_units: dict[str, float] = {p.name: 0.0 for p in pools}
    placed: dict[str, tuple[list[str], list[str], list[str]]] = {
        p.name: ([], [], []) for p in pools
    }
    unmet = 0.0
    for need in sorted(needs, key=lambda n: (-min(n.units.values()), n.model)):
        left = 1.0  # share of the model's demand still to place
        for name in sorted(need.units, key=lambda p: (cost[p] * need.units[p], p)):
            if left <= 0 or room[name] <= 0:
                continue
            units = need.units[name] * left
            taken = min(units, room[name])
            rounded = math.ceil(taken - 1e-9) if need.resident[name] else taken
            room[name] -= rounded
            if need.resident[name]:
                resident_units[name] += rounded
                placed[name][0].append(need.model)
            else:
                shared_units[name] += taken
                placed[name][1].append(need.model)
                if need.warm[name]:
                    placed[name][2].append(need.model)
            left -= left * taken / units if units > 0 else left
        if left > 1e-9:
            unmet += left * min(need.units.values())
    return {
        p.name: _pool_need(p, resident_units[p.name], shared_units[p.name], placed[p.name], unmet)
        for p in pools
    }


def _pool_need(
    pool: Pool,
    resident_units: float,
    shared_units: float,
    placed: tuple[list[str], list[str], list[str]],
    unmet: float,
) -> PoolNeed:
    """Whole instances: the resident ones, and enough shared ones for the shared work and
    for every warm model to be loaded or asleep somewhere (each instance holds one loaded
    model and `standby_slots` asleep; resident instances lend their sleep slots)."""
    slots = pool.standby_slots
    warm_room = max(0.0, len(placed[2]) - resident_units * slots)
    shared = max(math.ceil(shared_units - 1e-9), math.ceil(warm_room / (1 + slots)))
    replicas = min(pool.max_replicas, max(pool.min_replicas, int(resident_units) + shared))
    return PoolNeed(
        pool=pool.name,
        units=resident_units + shared_units,
        replicas=replicas,
        resident=tuple(placed[0]),
        shared=tuple(placed[1]),
        warm=tuple(placed[2]),
        unmet_units=unmet,
    )


def pools_of(
    config: AutoscaleConfig,
    fleet: Fleet,
    gpu_cost: Mapping[str, float],
    standby_slots: int = 0,
) -> list[Pool]:
    """The configured pools over the fleet's instances (ValueError naming a missing one);
    `standby_slots`: models each of their engines keeps asleep."""
    known = {i.id: i for i in fleet.instances}
    pools: list[Pool] = []
    for spec in config.pools:
        ids = [f"{spec.instance_prefix}-{k}" for k in range(spec.max_replicas)]
        missing = [i for i in ids if i not in known]
        if missing:
            raise ValueError(
                f"autoscale pool {spec.name}: the fleet has no instance {missing[0]} "
                f"(a pool of max_replicas {spec.max_replicas} needs all of {ids[0]}..{ids[-1]})"
            )
        instances = tuple(known[i] for i in ids)
        types = {i.gpu_type for i in instances}
        if len(types) != 1:
            raise ValueError(f"autoscale pool {spec.name}: instances of GPU types {sorted(types)}")
        first = instances[0]
        pools.append(
            Pool(
                spec.name,
                instances,
                spec.min_replicas,
                gpu_cost.get(first.gpu_type, 0.0) * first.gpus,
                standby_slots,
            )
        )
    return pools
