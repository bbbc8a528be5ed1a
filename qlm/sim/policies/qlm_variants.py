"""What distinguishes `qlm` from its ablations (`QlmVariant`), and how a variant sees the fleet
and the planner's configuration: the no-swap ablation's pinned fleet (`pinned_fleet`) and the
planner on a deterministic work budget that keeps simulations reproducible (`reproducible`).
The policy itself and the registration of its variants by name are in qlm.py."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from qlm.agents.reconcile import ReconcileConfig
from qlm.config import QlmConfig
from qlm.perf.profile import Profile
from qlm.types import Fleet


@dataclass(frozen=True, slots=True)
class QlmVariant:
    """Which ablation of qlm runs, the virtual time a solve is charged (re-plans: qlm.control)."""

    planning_latency_s: float | None = None  # None: planner time limit (milp), else 0
    planner: str | None = None  # override config.planner.policy (qlm-edf: "edf")
    reconcile: ReconcileConfig = field(default_factory=ReconcileConfig)
    pin_models: bool = False  # plan as if every loaded instance can hold only its model
    shortcuts: bool = True  # skip agent steps and queue tails that cannot change reconcile
    fetch_standby: bool = True  # fill free standby places with the worthiest models (warming)
    wake_for_backlog: bool = True  # a wake also counts the arrivals a backlog makes late


def pinned_fleet(fleet: Fleet) -> Fleet:
    """The fleet as the no-swap planner sees it: each instance with a model loaded gets a GPU
    type of its own that only that model has a profile for, so the planner can place there only
    that model. Instances without a model keep their real GPU type."""
    instances = []
    profiles: dict[tuple[str, str], Profile] = dict(fleet.profiles)
    for instance in fleet.instances:
        model = instance.loaded_model
        profile = None if model is None else fleet.profile(model, instance)
        if model is None or profile is None:
            instances.append(instance)
            continue
        gpu_type = f"{instance.gpu_type}#{model}"
        profiles[(model, gpu_type)] = replace(profile, gpu_type=gpu_type)
        instances.append(replace(instance, gpu_type=gpu_type))
    return Fleet(tuple(instances), profiles)


def reproducible(config: QlmConfig) -> QlmConfig:
    """CP-SAT on a deterministic work budget (as much work as its time limit allows, roughly),
    so a simulation gives the same plans, and the same outputs, on every run."""
    planner = config.planner
    if planner.backend != "cpsat" or planner.deterministic_work is not None:
        return config
    budget = planner.model_copy(update={"deterministic_work": planner.time_limit_s})
    return config.model_copy(update={"planner": budget})
