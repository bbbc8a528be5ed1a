"""Scenario files: a fleet (the shared `fleet:` section, qlm/config/fleet_config.py), a workload
and the policy configuration, in YAML.

`load_scenario(path)` validates a file with pydantic; every error names the file, the line and
the field. The format is documented in qlm/sim/README.md; sims/ has examples.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from qlm.config import (
    ConfigError,
    Problem,
    QlmConfig,
    SloClassConfig,
    StrictModel,
    fail_at,
    load_yaml_model,
)
from qlm.config.engine_config import EngineConfig
from qlm.config.fleet_config import FleetConfig
from qlm.prefixes.job_plan import PlanBudget, job_budget
from qlm.sim.fuzz import draw_scenario, parse_random_name
from qlm.sim.fuzz.many_models import draw_many_models, parse_many_name
from qlm.sim.workload import StreamConfig, iter_requests
from qlm.types import DEFAULT_SLO_CLASSES, Fleet, Request


def _paper_classes() -> tuple[SloClassConfig, ...]:
    return tuple(
        SloClassConfig(
            name=c.name,
            ttft_s=c.ttft_s,
            completion_s=c.completion_s,
            lateness_weight=c.lateness_weight,
            priority=c.priority,
        )
        for c in DEFAULT_SLO_CLASSES
    )


class Scenario(StrictModel):
    """A simulation scenario: who serves (fleet), what arrives (workload), and how QLM is
    configured. Times are seconds of simulated time."""

    name: str = Field(min_length=1)
    description: str = ""
    seed: int = Field(default=0, ge=0, description="Default seed for workload and policies.")
    slo_classes: tuple[SloClassConfig, ...] = Field(default_factory=_paper_classes, min_length=1)
    fleet_config: FleetConfig = Field(alias="fleet", description="Instances and profiles.")
    workload: tuple[StreamConfig, ...] = Field(min_length=1)
    qlm: QlmConfig = Field(
        default_factory=QlmConfig, description="QLM configuration (slo_classes: top level)."
    )
    rate_scale: float = Field(
        default=1.0,
        gt=0,
        description="Multiplies every stream's arrival rate (trace times are divided by it; "
        "backlogs are unchanged). Shipped scenarios give their base rates and the scale chosen "
        "for them.",
    )
    horizon_s: float | None = Field(
        default=None, gt=0, description="The run stops here; later arrivals are dropped."
    )
    engine: EngineConfig = Field(
        default_factory=EngineConfig,
        description="The simulated engines' scheduler settings "
        "(qlm/config/engine_config.py): token budget, preemption, swap space, waiting "
        "order. Every policy runs on them.",
    )

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        problems = list(self._problems())
        if problems:
            fail_at("Scenario", problems)
        return self

    def _problems(self) -> Iterator[Problem]:
        classes = [c.name for c in self.slo_classes]
        if len(set(classes)) != len(classes):
            yield ("slo_classes",), "class names must be unique"
        if "slo_classes" in self.qlm.model_fields_set:
            yield ("qlm", "slo_classes"), "set slo_classes at the top level of the scenario"
        names = [s.name for s in self.workload]
        fleet = self.fleet()
        for i, stream in enumerate(self.workload):
            if stream.name in names[:i]:
                yield ("workload", i, "name"), f"stream name {stream.name!r} is used twice"
            for c in stream.classes:
                if c not in classes:
                    yield ("workload", i, "classes", c), f"unknown SLO class; known: {classes}"
            for model in stream.models:
                if not self.fleet_config.can_serve(model, fleet):
                    yield (
                        ("workload", i, "models", model),
                        "no GPU type in the fleet can serve this model (no profile, or it "
                        "does not fit)",
                    )

    # --- the fleet (qlm/config/fleet_config.py) ---------------------------------------------------

    @property
    def models(self) -> tuple[str, ...]:
        """Every model the scenario mentions (workload and initial placements), sorted."""
        found = {m for s in self.workload for m in s.models}
        found |= {g.model for g in self.fleet_config.instances if g.model is not None}
        return tuple(sorted(found))

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """GPU types in the fleet (templates with count 0 included), in file order."""
        return self.fleet_config.group_gpu_types

    def fleet(self) -> Fleet:
        """The instances, with the profiles of every model the scenario mentions."""
        return self.fleet_config.fleet(self.models)

    def gpu_cost_per_hour(self, gpu_type: str) -> float:
        """Cost of one GPU of this type for an hour (fleet.gpu_types, else the default)."""
        return self.fleet_config.cost_per_hour(gpu_type)

    def with_gpu_costs(self, costs: Mapping[str, float]) -> Scenario:
        """The same scenario with these costs per GPU-hour (others unchanged)."""
        return self.model_copy(update={"fleet_config": self.fleet_config.with_gpu_costs(costs)})

    def fleet_cost_per_hour(self) -> float:
        return sum(
            self.gpu_cost_per_hour(inst.gpu_type) * inst.gpus for inst in self.fleet().instances
        )

    def fleet_counts(self) -> dict[str, int]:
        """Instances per GPU type."""
        return self.fleet_config.counts()

    def with_fleet_counts(self, counts: Mapping[str, int]) -> Scenario:
        """The same scenario with `counts[gpu_type]` instances of each named GPU type
        (FleetConfig.with_counts)."""
        return self.model_copy(update={"fleet_config": self.fleet_config.with_counts(counts)})

    # --- workload and configuration ---------------------------------------------------------

    def with_rate_scale(self, factor: float) -> Scenario:
        """Arrival rates x factor in every stream (trace times / factor; backlogs unchanged)."""
        if not factor > 0:
            raise ValueError("rate scale must be > 0")
        return self.model_copy(update={"rate_scale": self.rate_scale * factor})

    def streams(self) -> tuple[StreamConfig, ...]:
        """The workload's streams with rate_scale applied."""
        if self.rate_scale == 1.0:
            return self.workload
        return tuple(s.with_rate_scale(self.rate_scale) for s in self.workload)

    def iter_requests(self, seed: int | None = None) -> Iterator[Request]:
        """The workload's requests in arrival order, generated lazily."""
        return iter_requests(
            self.streams(),
            self.seed if seed is None else seed,
            self.config.slo_class_map(),
            self.horizon_s,
            self.plan_budget,
        )

    def plan_budget(self, model: str) -> PlanBudget:
        """What a batch job's part of `model` may hold (qlm/prefixes/job_plan.py)."""
        return job_budget(self.fleet(), model, self.config.grouping.max_group_size)

    def requests(self, seed: int | None = None) -> list[Request]:
        """The workload's requests in arrival order; max_output_tokens is each request's true
        output length. The same seed gives the same list."""
        return list(self.iter_requests(seed))

    @property
    def config(self) -> QlmConfig:
        """The QLM configuration with the scenario's SLO classes."""
        names = [c.name for c in self.slo_classes]
        data: dict[str, Any] = self.qlm.model_dump()
        data["slo_classes"] = [c.model_dump() for c in self.slo_classes]
        if data["default_slo_class"] not in names:
            data["default_slo_class"] = names[0]
        return QlmConfig.model_validate(data)


def random_scenario(seed: int, size: str = "quick") -> Scenario:
    """The random scenario of this seed and size (qlm/sim/fuzz): the same for the same
    arguments."""
    return Scenario.model_validate(draw_scenario(seed, size).document)


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file; trace and profile paths are relative to its folder.
    Raises qlm.config.ConfigError naming file:line: field. The name `random:SEED[:SIZE]` in
    place of a file draws a random scenario (qlm/sim/fuzz), so every command that loads
    scenarios (`qlm simulate random:7`) runs one; `many:SEED` a many-model one
    (qlm/sim/fuzz/many_models.py)."""
    try:
        drawn = parse_random_name(str(path))
        many = parse_many_name(str(path))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if drawn is not None:
        return random_scenario(*drawn)
    if many is not None:
        return Scenario.model_validate(draw_many_models(many).document)
    return load_yaml_model(path, Scenario)


def quick_sibling(path: Path, quick: bool) -> Path:
    """The scenario file to load: with `quick`, the sibling `X-quick.yaml` of `X.yaml` (a
    quick file itself stays); ConfigError naming both when it does not exist."""
    if not quick or path.stem.endswith("-quick"):
        return path
    sibling = path.with_name(f"{path.stem}-quick{path.suffix}")
    if not sibling.is_file():
        raise ConfigError(f"{path}: --quick needs {sibling}")
    return sibling
