"""The fleet: its GPU types, its instance groups and the performance profiles that say what
each instance can serve and how fast. One schema, the `fleet:` section of every file that
describes a fleet: the planning snapshot (`qlm plan`), the fleet file (`qlm serve`) and the
scenario (`qlm simulate`); the same names, limits and rules in all three:

- an instance group is `count` instances of one GPU type, `gpu_count` GPUs each (default: the
  model's profile's, else 1), with `model` loaded at the start. Its instances are named `id`
  when count is 1 and an id is given, else `<id>-0` .. `<id>-<count-1>` (default id:
  `<gpu type, lower case>-<model>`);
- a GPU type is built in (A10, A100, H100: qlm.types.DEFAULT_GPU_TYPES) or declared in
  `gpu_types`, which may also replace a built-in type's memory or price;
- the profile of a (model, GPU type) is the first found of: inline (`profiles`, the profile
  file format of qlm/engine/profiling/README.md), `profile_files` (files or folders of them,
  relative to the file that names them), the packaged ones (qlm/engine/profiling/profiles)
  unless `packaged_profiles` is false; a model named in `model_copies` (a fine-tune of a
  base model: its own weights, the base's size and speed) takes its base's profiles under its
  own name where it has none of its own;
- every group's initial model must run on its instances (a profile, and it fits)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator, model_validator

from qlm.config import Problem, StrictModel, fail_at, resolve_relative
from qlm.config.fleet_groups import InstanceGroupConfig as InstanceGroupConfig
from qlm.config.profile_files import ProfileFile, load_profile, packaged_profiles
from qlm.perf.profile import GIB, Profile
from qlm.types import DEFAULT_GPU_TYPES, Fleet, Instance

# Fields of the inline profile format before it became the profile file format.
_OLD_PROFILE_FIELDS = MappingProxyType(
    {
        "weight_gb": "weight_bytes (bytes)",
        "kv_kib_per_token": "kv_bytes_per_token (bytes)",
        "decode_batch_sizes": "decode_table: {batch_sizes: [...], step_s: [...]}",
        "decode_step_ms": "decode_table: {batch_sizes: [...], step_s: [...]} (seconds)",
    }
)


class GpuTypeConfig(StrictModel):
    """A GPU type beyond the built-in ones (e.g. the CPU a profile was measured on with
    `qlm profile --gpu-type cpu`), or a built-in one with another memory size or price."""

    memory_gib: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="Memory per GPU in GiB; required for a type that is not built in.",
    )
    cost_per_hour: float | None = Field(
        default=None, ge=0, description="Cost of one GPU-hour; default: the built-in's, else 0."
    )


def _existing_path(path: Path) -> Path:
    resolved = resolve_relative(path)
    if not resolved.exists():
        raise ValueError(f"no such file or folder: {resolved}")
    return resolved


class FleetConfig(StrictModel):
    """The `fleet:` section: instance groups, GPU types and profiles (module docstring)."""

    moved_fields = MappingProxyType(
        {
            "gpu_cost_per_hour": "set gpu_types: {<type>: {cost_per_hour: ...}}",
            "gpu_memory_gib": "set gpu_types: {<type>: {memory_gib: ...}}",
        }
    )

    instances: tuple[InstanceGroupConfig, ...] = Field(
        min_length=1, description="The instance groups, in order."
    )
    gpu_types: dict[str, GpuTypeConfig] = Field(
        default_factory=dict, description="GPU types added to (or replacing) the built-in ones."
    )
    profiles: tuple[ProfileFile, ...] = Field(
        default=(),
        description="Inline profiles (the profile file format); they replace those of "
        "profile_files and the packaged ones for the same (model, GPU type).",
    )
    profile_files: tuple[Annotated[Path, AfterValidator(_existing_path)], ...] = Field(
        default=(),
        description="Profile files (e.g. written by `qlm profile`) or folders of them, "
        "relative to this file; they replace packaged profiles (later files win).",
    )
    packaged_profiles: bool = Field(
        default=True,
        description="Fall back on the profiles shipped in qlm/engine/profiling/profiles.",
    )
    model_copies: dict[str, str] = Field(
        default_factory=dict,
        description="Model -> the base model whose profiles it takes (a fine-tune: its own "
        "weights, loaded on its own, the base's size and speed) where it has none of its own.",
    )

    @field_validator("profiles", mode="before")
    @classmethod
    def _current_profile_format(cls, profiles: Any) -> Any:
        if isinstance(profiles, Sequence) and not isinstance(profiles, str):
            old = list(_old_profile_fields(profiles))
            if old:
                fail_at("FleetConfig", old)
        return profiles

    @field_validator("profile_files")
    @classmethod
    def _readable_profile_files(cls, paths: tuple[Path, ...]) -> tuple[Path, ...]:
        _files_profiles(paths)  # a bad profile file fails here, naming its file and line
        return paths

    @model_validator(mode="after")
    def _consistent(self) -> FleetConfig:
        problems = [*self._gpu_type_problems(), *self._id_problems(), *self._copy_problems()]
        if not problems:
            problems = list(self._placement_problems())
        if problems:
            fail_at("FleetConfig", problems)
        return self

    def _gpu_type_problems(self) -> Iterator[Problem]:
        for name, gpu in self.gpu_types.items():
            if gpu.memory_gib is None and name not in DEFAULT_GPU_TYPES:
                yield ("gpu_types", name, "memory_gib"), "required for a type that is not built in"
        known = self.known_gpu_types()
        for i, group in enumerate(self.instances):
            if group.kv_pool and group.slices == 1:
                yield ("instances", i, "kv_pool"), "pools the KV of shared GPUs: set slices > 1"
            shares = group.slice_memory
            if shares is not None and (len(shares) != group.slices or sum(shares) > 1 + 1e-9):
                yield (
                    ("instances", i, "slice_memory"),
                    f"one share per slice ({group.slices}), adding up to 1 at most",
                )
            if group.gpu_type not in known:
                yield (
                    ("instances", i, "gpu_type"),
                    f"unknown gpu_type {group.gpu_type!r}; known: {', '.join(known)} "
                    "(add it under fleet.gpu_types)",
                )

    def _copy_problems(self) -> Iterator[Problem]:
        for name, base in self.model_copies.items():
            if base in self.model_copies:
                yield ("model_copies", name), f"its base {base!r} is itself a copy; name a base"
            elif base == name:
                yield ("model_copies", name), "a model cannot be a copy of itself"
            elif not self.profiles_for([base]):
                yield (
                    ("model_copies", name),
                    f"its base {base!r} has no profile on {', '.join(self.group_gpu_types)}",
                )

    def _id_problems(self) -> Iterator[Problem]:
        prefixes: set[str] = set()
        ids: set[str] = set()
        for i, group in enumerate(self.instances):
            names = set(group.instance_ids())
            if group.prefix in prefixes or names & ids:
                yield ("instances", i, "id"), f"instance id {group.prefix!r} is used twice"
            prefixes.add(group.prefix)
            ids |= names

    def _placement_problems(self) -> Iterator[Problem]:
        fleet = self.fleet({g.model for g in self.instances if g.model is not None})
        for i, group in enumerate(self.instances):
            device = group.prefix if group.slices > 1 else None
            home = self.home_slice(group, fleet.profiles)
            template = self._instance(group, group.prefix, fleet.profiles, device, home, home)
            if group.model is not None and not fleet.can_serve(template, group.model):
                yield (
                    ("instances", i, "model"),
                    f"{group.model} cannot run on {template.gpu_count} x {group.gpu_type}"
                    + (" in any of its slices' memory" if group.slices > 1 else "")
                    + " (no profile, or it does not fit)",
                )

    # --- GPU types ----------------------------------------------------------------------------

    def known_gpu_types(self) -> list[str]:
        """The built-in GPU types, then those added in gpu_types."""
        return [*DEFAULT_GPU_TYPES, *(g for g in self.gpu_types if g not in DEFAULT_GPU_TYPES)]

    @property
    def group_gpu_types(self) -> tuple[str, ...]:
        """GPU types of the instance groups (templates with count 0 included), in file order."""
        return tuple(dict.fromkeys(g.gpu_type for g in self.instances))

    def memory_bytes(self, gpu_type: str) -> int:
        """Memory of one GPU of this type (gpu_types first, else the built-in type's)."""
        spec = self.gpu_types.get(gpu_type)
        if spec is not None and spec.memory_gib is not None:
            return int(spec.memory_gib * GIB)
        return DEFAULT_GPU_TYPES[gpu_type].memory_bytes

    def cost_per_hour(self, gpu_type: str) -> float:
        """Cost of one GPU of this type for an hour (gpu_types, else built-in, else 0)."""
        spec = self.gpu_types.get(gpu_type)
        if spec is not None and spec.cost_per_hour is not None:
            return spec.cost_per_hour
        builtin = DEFAULT_GPU_TYPES.get(gpu_type)
        return builtin.cost_per_hour if builtin is not None else 0.0

    def with_gpu_costs(self, costs: Mapping[str, float]) -> FleetConfig:
        """The same fleet with these costs per GPU-hour (ValueError for a negative one)."""
        types = dict(self.gpu_types)
        for gpu, cost in costs.items():
            old = types.get(gpu, GpuTypeConfig())
            types[gpu] = GpuTypeConfig(memory_gib=old.memory_gib, cost_per_hour=cost)
        return self.model_copy(update={"gpu_types": types})

    # --- profiles and instances ---------------------------------------------------------------

    def profiles_for(self, models: Iterable[str]) -> dict[tuple[str, str], Profile]:
        """The profile of every (model, GPU type of the groups) pair that has one, models in
        the order given, then GPU types in file order; a copy (`model_copies`) without one of
        its own takes its base's, under its own name."""
        sources = (
            {(p.model, p.gpu_type): p.to_profile() for p in self.profiles},
            _files_profiles(self.profile_files),
            _packaged() if self.packaged_profiles else {},
        )

        def found(key: tuple[str, str]) -> Profile | None:
            return next((s[key] for s in sources if key in s), None)

        out: dict[tuple[str, str], Profile] = {}
        for model in models:
            base = self.model_copies.get(model)
            for gpu in self.group_gpu_types:
                profile = found((model, gpu))
                if profile is None and base is not None:
                    of_base = found((base, gpu))
                    profile = None if of_base is None else dataclasses.replace(of_base, model=model)
                if profile is not None:
                    out[(model, gpu)] = profile
        return out

    def fleet(self, models: Iterable[str]) -> Fleet:
        """The instances, and the profiles of these models (sorted) on the fleet's GPU types."""
        profiles = self.profiles_for(sorted(set(models)))
        instances = [
            self._instance(group, engine, profiles, device if group.slices > 1 else None, j, home)
            for group, home in ((g, self.home_slice(g, profiles)) for g in self.instances)
            for device, engines in group.devices()
            for j, engine in enumerate(engines)
        ]
        return Fleet(tuple(instances), profiles)

    def home_slice(
        self, group: InstanceGroupConfig, profiles: Mapping[tuple[str, str], Profile]
    ) -> int:
        """The slice whose engine starts with the group's model: the smallest share it fits
        (best fit, so the larger shares stay free for larger models), the first of equals;
        0 when it fits none (validation refuses that) or the group is not sliced."""
        model = group.model
        if group.slices == 1 or model is None:
            return 0
        fits = Fleet((), profiles).can_serve
        engines = (self._instance(group, group.prefix, profiles, group.prefix, j) for j in
                   range(group.slices))  # fmt: skip
        fitting = [j for j, engine in enumerate(engines) if fits(engine, model)]
        return min(fitting, key=lambda j: (self.slice_bytes(group, j), j), default=0)

    def _instance(
        self,
        group: InstanceGroupConfig,
        inst_id: str,
        profiles: Mapping[tuple[str, str], Profile],
        device: str | None = None,
        slice_index: int = 0,
        home: int = 0,
    ) -> Instance:
        """One engine of the group: the `home` slice of its GPUs starts with the group's model
        (`home_slice`), the others idle."""
        gpus = self.gpu_count(group, group.model, profiles)
        memory = self.slice_bytes(group, slice_index)
        model = group.model if slice_index == home else None
        return Instance(inst_id, group.gpu_type, gpus, memory, model, slices=group.slices,
                        device=device, kv_pool=group.kv_pool and device is not None,
                        role=group.role,
                        kv_link_bytes_per_s=group.kv_link_gb_per_s * 1e9)  # fmt: skip

    def slice_bytes(self, group: InstanceGroupConfig, slice_index: int) -> int:
        """Memory per GPU of one engine of the group: its slice's share."""
        whole = self.memory_bytes(group.gpu_type)
        if group.slice_memory is None:
            return whole // group.slices
        return int(whole * group.slice_memory[slice_index])

    @staticmethod
    def gpu_count(
        group: InstanceGroupConfig,
        model: str | None,
        profiles: Mapping[tuple[str, str], Profile],
    ) -> int:
        """GPUs per instance of the group, for this model (the group's, else the profile's)."""
        if group.gpu_count is not None:
            return group.gpu_count
        profile = profiles.get((model, group.gpu_type)) if model is not None else None
        return profile.gpu_count if profile is not None else 1

    def can_serve(self, model: str, fleet: Fleet) -> bool:
        """Some group's GPU type (with the model's GPU count) can serve the model."""
        for group in self.instances:
            gpus = self.gpu_count(group, model, fleet.profiles)
            memory = max(self.slice_bytes(group, j) for j in range(group.slices))
            if fleet.can_serve(Instance("t", group.gpu_type, gpus, memory), model):
                return True
        return False

    # --- sizes --------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Instances per GPU type."""
        counts = dict.fromkeys(self.group_gpu_types, 0)
        for group in self.instances:
            counts[group.gpu_type] += group.count
        return counts

    def with_counts(self, counts: Mapping[str, int]) -> FleetConfig:
        """The same fleet with `counts[gpu_type]` instances of each named GPU type, shared
        among that type's groups in proportion to their counts (equally if all are 0;
        largest remainder). Types not named keep their groups."""
        unknown = sorted(set(counts) - set(self.group_gpu_types))
        if unknown:
            raise ValueError(
                f"GPU types {unknown} are not in the fleet; add a group (count: 0) for each "
                f"as a template; the fleet has {list(self.group_gpu_types)}"
            )
        groups = list(self.instances)
        for gpu, total in counts.items():
            if total < 0:
                raise ValueError(f"{gpu}: count must be >= 0")
            idx = [i for i, g in enumerate(groups) if g.gpu_type == gpu]
            shares = _apportion(total, [groups[i].count for i in idx])
            for i, n in zip(idx, shares, strict=True):
                groups[i] = groups[i].model_copy(update={"count": n})
        return self.model_copy(update={"instances": tuple(groups)})


def _old_profile_fields(profiles: Sequence[Any]) -> Iterator[Problem]:
    for i, profile in enumerate(profiles):
        for name, new in _OLD_PROFILE_FIELDS.items():
            if isinstance(profile, Mapping) and name in profile:
                yield (
                    (i, name),
                    "no longer read: the inline format is the profile file format "
                    f"(qlm/engine/profiling/README.md); use {new}",
                )


@functools.cache
def _packaged() -> Mapping[tuple[str, str], Profile]:
    return MappingProxyType({p.key: p for p in packaged_profiles()})


@functools.cache
def _files_profiles(paths: tuple[Path, ...]) -> Mapping[tuple[str, str], Profile]:
    """The profiles in these files and folders (every *.yaml of a folder, sorted)."""
    out: dict[tuple[str, str], Profile] = {}
    for path in paths:
        files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        for file in files:
            profile = load_profile(file)
            out[profile.key] = profile
    return MappingProxyType(out)


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
