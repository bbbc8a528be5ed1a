"""Scenario files: a fleet, a workload and the policy configuration, in YAML.

`load_scenario(path)` validates a file with pydantic; every error names the file, the line and
the field. The format is documented in qlm/sim/README.md; sims/ has examples.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from qlm.config import QlmConfig, SloClassConfig, load_yaml_model
from qlm.engine.profiling.library import load_profile, profile_named
from qlm.perf.profile import GIB, Profile
from qlm.sim.workload import StreamSpec, iter_requests, relative_to, resolve_relative
from qlm.snapshot import ProfileSpec
from qlm.types import DEFAULT_GPU_TYPES, DEFAULT_SLO_CLASSES, Fleet, Instance, Request


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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


class InstanceGroupSpec(_Strict):
    """`count` instances of one GPU type with the same initial model. count 0 keeps the
    group as a template for `with_fleet_counts` and `qlm capacity`."""

    gpu_type: str = Field(description="A10, A100, H100 or a type of the fleet's gpu_types.")
    count: int = Field(ge=0, le=100_000)
    model: str | None = Field(default=None, description="Model loaded at the start.")
    gpu_count: int | None = Field(
        default=None, ge=1, le=64, description="GPUs per instance; default the model's profile."
    )
    id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Instance id prefix; default gpu type and model.",
    )

    @property
    def prefix(self) -> str:
        if self.id is not None:
            return self.id
        return f"{self.gpu_type.lower()}-{self.model}" if self.model else self.gpu_type.lower()


def _existing_path(path: Path) -> Path:
    resolved = resolve_relative(path)
    if not resolved.exists():
        raise ValueError(f"no such file or folder: {resolved}")
    return resolved


class GpuTypeSpec(_Strict):
    """A GPU type beyond the defaults (or replacing one), e.g. the CPU a profile was measured
    on with `qlm profile --gpu-type cpu`."""

    memory_gib: float = Field(gt=0, description="Memory per GPU in GiB.")
    cost_per_hour: float = Field(default=0.0, ge=0, description="Cost of one GPU-hour.")


class FleetSpec(_Strict):
    instances: tuple[InstanceGroupSpec, ...] = Field(min_length=1)
    profiles: tuple[ProfileSpec, ...] = Field(
        default=(), description="Inline profiles; replace the packaged ones by (model, gpu)."
    )
    profile_files: tuple[Annotated[Path, AfterValidator(_existing_path)], ...] = Field(
        default=(),
        description="Profile files (qlm/engine/profiling/README.md format, e.g. written by "
        "`qlm profile`) or folders of them, relative to the scenario file; they replace packaged "
        "profiles by (model, gpu) and inline `profiles` replace them.",
    )
    gpu_types: dict[str, GpuTypeSpec] = Field(
        default_factory=dict, description="GPU types added to (or replacing) the defaults."
    )
    gpu_cost_per_hour: dict[str, float] = Field(
        default_factory=dict, description="Cost of one GPU-hour by GPU type (overrides)."
    )

    @model_validator(mode="after")
    def _unique_prefixes(self) -> FleetSpec:
        prefixes = [g.prefix for g in self.instances]
        for i, prefix in enumerate(prefixes):
            if prefix in prefixes[:i]:
                _fail([(("instances", i, "id"), f"instance id prefix {prefix!r} is used twice")])
        known = [*DEFAULT_GPU_TYPES, *(g for g in self.gpu_types if g not in DEFAULT_GPU_TYPES)]
        for i, group in enumerate(self.instances):
            if group.gpu_type not in known:
                _fail(
                    [
                        (
                            ("instances", i, "gpu_type"),
                            f"unknown gpu_type {group.gpu_type!r}; known: {', '.join(known)} "
                            "(add it under fleet.gpu_types)",
                        )
                    ]
                )
        for gpu, cost in self.gpu_cost_per_hour.items():
            if gpu not in known or cost < 0:
                _fail([(("gpu_cost_per_hour", gpu), "a known GPU type with a cost >= 0")])
        return self

    @field_validator("profile_files")
    @classmethod
    def _readable_profile_files(cls, paths: tuple[Path, ...]) -> tuple[Path, ...]:
        _files_profiles(paths)  # a bad profile file fails here, naming its file and line
        return paths

    def memory_bytes(self, gpu_type: str) -> int:
        """Memory of one GPU of this type (gpu_types first, else the defaults)."""
        spec = self.gpu_types.get(gpu_type)
        return int(spec.memory_gib * GIB) if spec else DEFAULT_GPU_TYPES[gpu_type].memory_bytes

    def default_cost_per_hour(self, gpu_type: str) -> float:
        spec = self.gpu_types.get(gpu_type)
        return spec.cost_per_hour if spec else DEFAULT_GPU_TYPES[gpu_type].cost_per_hour

    def file_profiles(self) -> dict[tuple[str, str], Profile]:
        """Profiles from profile_files, by (model, GPU type); later files win."""
        return dict(_files_profiles(self.profile_files))


class Scenario(_Strict):
    """A simulation scenario: who serves (fleet), what arrives (workload), and how QLM is
    configured. Times are seconds of simulated time."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1)
    description: str = ""
    seed: int = Field(default=0, ge=0, description="Default seed for workload and policies.")
    slo_classes: tuple[SloClassConfig, ...] = Field(default_factory=_paper_classes, min_length=1)
    fleet_spec: FleetSpec = Field(alias="fleet", description="Instances and profiles.")
    workload: tuple[StreamSpec, ...] = Field(min_length=1)
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

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        problems = list(self._problems())
        if problems:
            _fail(problems)
        return self

    def _problems(self) -> Iterator[tuple[tuple[str | int, ...], str]]:
        classes = [c.name for c in self.slo_classes]
        if len(set(classes)) != len(classes):
            yield ("slo_classes",), "class names must be unique"
        if "slo_classes" in self.qlm.model_fields_set:
            yield ("qlm", "slo_classes"), "set slo_classes at the top level of the scenario"
        names = [s.name for s in self.workload]
        fleet = self.fleet_of(self.fleet_spec.instances)
        for i, stream in enumerate(self.workload):
            if stream.name in names[:i]:
                yield ("workload", i, "name"), f"stream name {stream.name!r} is used twice"
            for c in stream.classes:
                if c not in classes:
                    yield ("workload", i, "classes", c), f"unknown SLO class; known: {classes}"
            for model in stream.models:
                if not self._servable(model, fleet):
                    yield (
                        ("workload", i, "models", model),
                        "no GPU type in the fleet can serve this model (no profile, or it "
                        "does not fit)",
                    )
        for i, group in enumerate(self.fleet_spec.instances):
            template = self._instance(group, 0, fleet.profiles)
            if group.model is not None and not fleet.can_serve(template, group.model):
                yield (
                    ("fleet", "instances", i, "model"),
                    f"{group.model} cannot run on {template.gpu_count} x {group.gpu_type} "
                    "(no profile, or it does not fit)",
                )

    # --- the fleet ----------------------------------------------------------------------------

    @property
    def models(self) -> tuple[str, ...]:
        """Every model the scenario mentions (workload and initial placements), sorted."""
        found = {m for s in self.workload for m in s.models}
        found |= {g.model for g in self.fleet_spec.instances if g.model is not None}
        return tuple(sorted(found))

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """GPU types in the fleet (templates with count 0 included), in file order."""
        return tuple(dict.fromkeys(g.gpu_type for g in self.fleet_spec.instances))

    def profiles(self) -> dict[tuple[str, str], Profile]:
        """Profiles for every (model, GPU type) pair of the scenario that has one: inline
        ones first, then those of profile_files, else the packaged library's."""
        inline = {p.to_profile().key: p.to_profile() for p in self.fleet_spec.profiles}
        files = self.fleet_spec.file_profiles()
        out: dict[tuple[str, str], Profile] = {}
        for model in self.models:
            for gpu in self.gpu_types:
                profile = inline.get((model, gpu)) or files.get((model, gpu))
                profile = profile or _packaged(model, gpu)
                if profile is not None:
                    out[(model, gpu)] = profile
        return out

    def fleet(self) -> Fleet:
        return self.fleet_of(self.fleet_spec.instances)

    def fleet_of(self, groups: Sequence[InstanceGroupSpec]) -> Fleet:
        profiles = self.profiles()
        instances = [
            self._instance(g, k, profiles) for g in groups if g.count for k in range(g.count)
        ]
        return Fleet(tuple(instances), profiles)

    def _servable(self, model: str, fleet: Fleet) -> bool:
        """Some group's GPU type (with the model's GPU count) can serve the model."""
        for group in self.fleet_spec.instances:
            gpus = _gpu_count(group, model, fleet.profiles)
            memory = self.fleet_spec.memory_bytes(group.gpu_type)
            if fleet.can_serve(Instance("t", group.gpu_type, gpus, memory), model):
                return True
        return False

    def _instance(
        self, group: InstanceGroupSpec, k: int, profiles: Mapping[tuple[str, str], Profile]
    ) -> Instance:
        gpus = _gpu_count(group, group.model, profiles)
        memory = self.fleet_spec.memory_bytes(group.gpu_type)
        return Instance(f"{group.prefix}-{k}", group.gpu_type, gpus, memory, group.model)

    def gpu_cost_per_hour(self, gpu_type: str) -> float:
        """Cost of one GPU of this type for an hour (scenario override, else the default)."""
        override = self.fleet_spec.gpu_cost_per_hour.get(gpu_type)
        return override if override is not None else self.fleet_spec.default_cost_per_hour(gpu_type)

    def with_gpu_costs(self, costs: Mapping[str, float]) -> Scenario:
        """The same scenario with these costs per GPU-hour (others unchanged)."""
        merged = {**self.fleet_spec.gpu_cost_per_hour, **costs}
        fleet = FleetSpec.model_validate(
            {**self.fleet_spec.model_dump(), "gpu_cost_per_hour": merged}
        )
        return self.model_copy(update={"fleet_spec": fleet})

    def fleet_cost_per_hour(self) -> float:
        return sum(
            self.gpu_cost_per_hour(inst.gpu_type) * inst.gpu_count
            for inst in self.fleet().instances
        )

    def fleet_counts(self) -> dict[str, int]:
        """Instances per GPU type."""
        counts = dict.fromkeys(self.gpu_types, 0)
        for group in self.fleet_spec.instances:
            counts[group.gpu_type] += group.count
        return counts

    def with_fleet_counts(self, counts: Mapping[str, int]) -> Scenario:
        """The same scenario with `counts[gpu_type]` instances of each named GPU type, shared
        among that type's instance groups in proportion to their counts (equally if all are
        0; largest remainder). Types not named keep their groups."""
        unknown = sorted(set(counts) - set(self.gpu_types))
        if unknown:
            raise ValueError(
                f"GPU types {unknown} are not in the fleet; add a group (count: 0) for each "
                f"as a template; the fleet has {list(self.gpu_types)}"
            )
        groups = list(self.fleet_spec.instances)
        for gpu, total in counts.items():
            if total < 0:
                raise ValueError(f"{gpu}: count must be >= 0")
            idx = [i for i, g in enumerate(groups) if g.gpu_type == gpu]
            shares = _apportion(total, [groups[i].count for i in idx])
            for i, n in zip(idx, shares, strict=True):
                groups[i] = groups[i].model_copy(update={"count": n})
        fleet = self.fleet_spec.model_copy(update={"instances": tuple(groups)})
        return self.model_copy(update={"fleet_spec": fleet})

    # --- workload and configuration ---------------------------------------------------------

    def with_rate_scale(self, factor: float) -> Scenario:
        """Arrival rates x factor in every stream (trace times / factor; backlogs unchanged)."""
        if not factor > 0:
            raise ValueError("rate scale must be > 0")
        return self.model_copy(update={"rate_scale": self.rate_scale * factor})

    def streams(self) -> tuple[StreamSpec, ...]:
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
        )

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


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file; trace paths are relative to its folder. Raises
    qlm.config.ConfigError naming file:line: field."""
    with relative_to(path.resolve().parent):
        return load_yaml_model(path, Scenario)


# --- helpers ---------------------------------------------------------------------------------


def _fail(problems: Sequence[tuple[tuple[str | int, ...], str]]) -> None:
    """Raise a validation error at precise locations (pydantic prefixes the outer path)."""
    raise ValidationError.from_exception_data(
        "Scenario",
        [
            InitErrorDetails(
                type=PydanticCustomError("reference", "{message}", {"message": message}),
                loc=loc,
                input=None,
            )
            for loc, message in problems
        ],
    )


def _packaged(model: str, gpu_type: str) -> Profile | None:
    try:
        return profile_named(model, gpu_type)
    except KeyError:
        return None


@functools.cache
def _files_profiles(paths: tuple[Path, ...]) -> dict[tuple[str, str], Profile]:
    """The profiles in these files and folders (every *.yaml of a folder, sorted)."""
    out: dict[tuple[str, str], Profile] = {}
    for path in paths:
        files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        for file in files:
            profile = load_profile(file)
            out[profile.key] = profile
    return out


def _gpu_count(
    group: InstanceGroupSpec, model: str | None, profiles: Mapping[tuple[str, str], Profile]
) -> int:
    if group.gpu_count is not None:
        return group.gpu_count
    profile = profiles.get((model, group.gpu_type)) if model is not None else None
    return profile.gpu_count if profile is not None else 1


def _apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split total into len(weights) integers in proportion (largest remainder; ties to the
    earlier)."""
    w = [float(x) for x in weights] if sum(weights) > 0 else [1.0] * len(weights)
    quotas = [total * x / sum(w) for x in w]
    shares = [int(q) for q in quotas]
    order = sorted(range(len(w)), key=lambda i: (-(quotas[i] - shares[i]), i))
    for i in order[: total - sum(shares)]:
        shares[i] += 1
    return shares
