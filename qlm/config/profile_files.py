"""Profiles as data files: the YAML format, its loader and writer, and the packaged profiles.

Question answered: how is a profile stored, read back and written, and which profiles ship with
QLM (profiles/*.yaml here, made by derive.py)? A profile file holds one Profile with its
provenance (see README.md here, "The profile file"). The decode table and the prefill rate may
be left out when a step-time model is given: they are then derived from it at
`typical_context_tokens` (and the file says so by omission).
Files are validated by pydantic through `qlm.config.load_yaml_model`, so an error names the
file, the line and the field.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from qlm.config import StrictModel, load_yaml_model
from qlm.perf.profile import Profile
from qlm.perf.step import StepTime

# Rows of a derived decode table (those up to the profile's max_batch_size are kept).
DEFAULT_TABLE_BATCH_SIZES: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 512, 1024)

# Every numeric field a provenance entry may describe.
PROFILE_FIELDS: frozenset[str] = frozenset(
    {
        "gpu_count",
        "weight_bytes",
        "kv_bytes_per_token",
        "step_time.base_s",
        "step_time.per_prefill_token_s",
        "step_time.per_decode_seq_s",
        "step_time.per_context_token_s",
        "typical_context_tokens",
        "decode_table",
        "prefill_tokens_per_s",
        "output_tokens_mean",
        "output_tokens_std",
        "load_s",
        "wake_s",
        "max_batch_size",
        "min_kv_tokens",
        "gpu_memory_utilization",
    }
)


class StepTimeConfig(StrictModel):
    """t = base_s + per_prefill_token_s * prefill + per_decode_seq_s * decodes
    + per_context_token_s * context (seconds; see qlm/perf/step.py)."""

    base_s: float = Field(gt=0, description="Fixed cost of one iteration.")
    per_prefill_token_s: float = Field(gt=0, description="Per prompt token prefilled.")
    per_decode_seq_s: float = Field(ge=0, description="Per sequence decoding one token.")
    per_context_token_s: float = Field(ge=0, description="Per KV token attended.")

    def to_step_time(self) -> StepTime:
        return StepTime(
            self.base_s, self.per_prefill_token_s, self.per_decode_seq_s, self.per_context_token_s
        )


class DecodeTableConfig(StrictModel):
    """Decode iteration time by batch size (what the estimator interpolates)."""

    batch_sizes: tuple[int, ...] = Field(min_length=1)
    step_s: tuple[float, ...] = Field(min_length=1)

    @field_validator("batch_sizes")
    @classmethod
    def _increasing_sizes(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if min(sizes) < 1 or list(sizes) != sorted(set(sizes)):
            raise ValueError("batch sizes must be >= 1 and strictly increasing")
        return sizes

    @field_validator("step_s")
    @classmethod
    def _positive_steps(cls, steps: tuple[float, ...]) -> tuple[float, ...]:
        if min(steps) <= 0:
            raise ValueError("step times must be > 0")
        if any(a > b for a, b in itertools.pairwise(steps)):
            raise ValueError("step times must not decrease with batch size")
        return steps

    @model_validator(mode="after")
    def _same_length(self) -> DecodeTableConfig:
        if len(self.batch_sizes) != len(self.step_s):
            raise ValueError("batch_sizes and step_s differ in length")
        return self


class FieldSource(StrictModel):
    """Where one number comes from."""

    kind: Literal["measured", "published", "derived", "assumed"] = Field(
        description="measured: from someone's measurements (say whose); published: a stated "
        "fact such as a model config or a datasheet (say where); derived: computed from other "
        "numbers (say how); assumed: a stated choice."
    )
    source: str = Field(min_length=1, description="The source or the derivation.")


class Provenance(StrictModel):
    summary: str = ""
    fields: dict[str, FieldSource] = Field(default_factory=dict)
    references: dict[str, str] = Field(
        default_factory=dict, description="Short name -> full citation, used in sources."
    )

    @field_validator("fields")
    @classmethod
    def _known_fields(cls, fields: dict[str, FieldSource]) -> dict[str, FieldSource]:
        unknown = sorted(set(fields) - PROFILE_FIELDS)
        if unknown:
            raise ValueError(f"unknown profile fields {unknown}; known: {sorted(PROFILE_FIELDS)}")
        return fields

    def render(self) -> str:
        """One line for Profile.provenance."""
        parts = [self.summary] if self.summary else []
        parts += [f"{name}: {src.kind} ({src.source})" for name, src in self.fields.items()]
        return "; ".join(parts)


class MeasuredIteration(StrictModel):
    """One measured engine iteration (or the mean of a run of like ones: a decode run's steps)
    and what the fitted step model predicts for it."""

    kind: Literal["prefill", "decode", "mixed"] = Field(
        description="prefill: a prompt alone; decode: a batch only decoding; mixed: a prompt "
        "prefilled while a batch decodes."
    )
    prefill_tokens: float = Field(ge=0)
    decode_seqs: float = Field(ge=0)
    context_tokens: float = Field(ge=0)
    measured_s: float = Field(gt=0)
    predicted_s: float = Field(gt=0)


class FitQuality(StrictModel):
    """How well the fitted step model explains the measured iterations."""

    samples: int = Field(ge=1)
    r_squared: float | None = Field(description="Of the absolute times; None if undefined.")
    max_relative_error: float = Field(ge=0)
    rms_relative_error: float = Field(ge=0)


class Measurement(StrictModel):
    """How `qlm profile` measured a live engine (see README.md, "Profiling a live engine")."""

    tool: str = Field(min_length=1, description="The command that measured.")
    engine: str = Field(min_length=1, description="Engine and version.")
    model_path: str = Field(min_length=1)
    measured_at: str = Field(min_length=1, description="Start of the measurement, ISO 8601 UTC.")
    host: str = ""
    load_average: tuple[float, float, float] = Field(
        description="1/5/15-minute load average of the host when the measurement ended."
    )
    wall_s: float = Field(ge=0, description="How long the measurement took.")
    engine_settings: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    grid: dict[str, int | tuple[int, ...]] = Field(
        default_factory=dict, description="The planned grid (qlm/engine/profiling/probes.py)."
    )
    load_s_samples: tuple[float, ...] = Field(default=(), description="Each model load.")
    wake_s_samples: tuple[float, ...] = Field(
        default=(), description="Each switch back to a standby server (the standby tier)."
    )
    skipped_probes: tuple[str, ...] = Field(
        default=(), description="Probes that never got a clean measurement window."
    )
    request_overhead_s: float | None = Field(
        default=None,
        description="Median client-seen time to first token minus the engine's own prefill "
        "time for a prompt alone (HTTP, scheduling, streaming); not in the step model.",
    )
    fit: FitQuality
    iterations: tuple[MeasuredIteration, ...] = Field(min_length=1)


class ProfileFile(StrictModel):
    """One profile file."""

    model: str = Field(min_length=1)
    gpu_type: str = Field(min_length=1)
    gpu_count: int = Field(default=1, ge=1, description="GPUs per instance (tensor parallel).")
    weight_bytes: int = Field(gt=0)
    kv_bytes_per_token: int = Field(gt=0, description="Over all GPUs of the instance.")
    step_time: StepTimeConfig | None = None
    typical_context_tokens: int | None = Field(
        default=None, ge=1, description="Tokens per sequence at which decode_table is derived."
    )
    decode_table: DecodeTableConfig | None = None
    prefill_tokens_per_s: float | None = Field(default=None, gt=0)
    output_tokens_mean: float = Field(gt=0)
    output_tokens_std: float = Field(ge=0)
    load_s: float = Field(ge=0, description="Cold load: seconds until a fresh engine serves.")
    wake_s: float | None = Field(
        default=None,
        ge=0,
        description="Standby tier: seconds until a model sleeping on the instance (weights in "
        "host memory) serves again; None: no standby tier.",
    )
    max_batch_size: int = Field(default=256, ge=1)
    min_kv_tokens: int = Field(default=4096, ge=0)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    provenance: Provenance = Field(default_factory=Provenance)
    measurement: Measurement | None = Field(
        default=None, description="How a measured profile was measured (qlm profile)."
    )

    @model_validator(mode="after")
    def _complete(self) -> ProfileFile:
        if self.decode_table is None and (
            self.step_time is None or self.typical_context_tokens is None
        ):
            raise ValueError("give decode_table, or step_time with typical_context_tokens")
        if self.prefill_tokens_per_s is None and self.step_time is None:
            raise ValueError("give prefill_tokens_per_s, or step_time")
        self.to_profile()  # Profile's own checks
        return self

    def to_profile(self) -> Profile:
        step = None if self.step_time is None else self.step_time.to_step_time()
        sizes, steps = self._table(step)
        prefill = self.prefill_tokens_per_s
        if prefill is None:
            assert step is not None
            prefill = step.prefill_tokens_per_s
        return Profile(
            model=self.model,
            gpu_type=self.gpu_type,
            gpu_count=self.gpu_count,
            weight_bytes=self.weight_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            decode_batch_sizes=sizes,
            decode_step_s=steps,
            prefill_tokens_per_s=prefill,
            output_tokens_mean=self.output_tokens_mean,
            output_tokens_std=self.output_tokens_std,
            load_s=self.load_s,
            wake_s=self.wake_s,
            max_batch_size=self.max_batch_size,
            min_kv_tokens=self.min_kv_tokens,
            gpu_memory_utilization=self.gpu_memory_utilization,
            provenance=self.provenance.render(),
            step_time=step,
        )

    def _table(self, step: StepTime | None) -> tuple[tuple[int, ...], tuple[float, ...]]:
        if self.decode_table is not None:
            return self.decode_table.batch_sizes, self.decode_table.step_s
        assert step is not None
        assert self.typical_context_tokens is not None
        sizes = table_batch_sizes(self.max_batch_size)
        return sizes, step.decode_table(sizes, self.typical_context_tokens)

    @classmethod
    def of(
        cls,
        profile: Profile,
        provenance: Provenance | str | None = None,
        typical_context_tokens: int | None = None,
    ) -> ProfileFile:
        """The file for a Profile (decode table and prefill rate written out)."""
        if provenance is None:
            provenance = profile.provenance
        if isinstance(provenance, str):
            provenance = Provenance(summary=provenance)
        st = profile.step_time
        return cls(
            model=profile.model,
            gpu_type=profile.gpu_type,
            gpu_count=profile.gpu_count,
            weight_bytes=profile.weight_bytes,
            kv_bytes_per_token=profile.kv_bytes_per_token,
            step_time=None
            if st is None
            else StepTimeConfig(
                base_s=st.base_s,
                per_prefill_token_s=st.per_prefill_token_s,
                per_decode_seq_s=st.per_decode_seq_s,
                per_context_token_s=st.per_context_token_s,
            ),
            typical_context_tokens=typical_context_tokens,
            decode_table=DecodeTableConfig(
                batch_sizes=profile.decode_batch_sizes, step_s=profile.decode_step_s
            ),
            prefill_tokens_per_s=profile.prefill_tokens_per_s,
            output_tokens_mean=profile.output_tokens_mean,
            output_tokens_std=profile.output_tokens_std,
            load_s=profile.load_s,
            wake_s=profile.wake_s,
            max_batch_size=profile.max_batch_size,
            min_kv_tokens=profile.min_kv_tokens,
            gpu_memory_utilization=profile.gpu_memory_utilization,
            provenance=provenance,
        )


def table_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Rows of a derived decode table: DEFAULT_TABLE_BATCH_SIZES up to max_batch_size."""
    sizes = tuple(b for b in DEFAULT_TABLE_BATCH_SIZES if b < max_batch_size)
    return (*sizes, max_batch_size)


def load_profile_file(path: Path) -> ProfileFile:
    """Parse and validate a profile file (ConfigError naming file:line: field)."""
    return load_yaml_model(Path(path), ProfileFile)


def load_profile(path: Path) -> Profile:
    return load_profile_file(path).to_profile()


def save_profile(
    profile: Profile,
    path: Path,
    provenance: Provenance | str | None = None,
    typical_context_tokens: int | None = None,
) -> None:
    """Write a profile file that load_profile reads back to an equal Profile (provenance
    becomes its rendered form)."""
    write_profile_file(ProfileFile.of(profile, provenance, typical_context_tokens), path)


def write_profile_file(spec: ProfileFile, path: Path) -> None:
    """Write a validated profile file (decode table and prefill rate as given)."""
    header = (
        f"# QLM engine profile: {spec.model} on {spec.gpu_count} x {spec.gpu_type}.\n"
        "# Format and provenance rules: qlm/engine/profiling/README.md. Times in seconds.\n"
    )
    body = yaml.dump(
        spec.model_dump(mode="json", exclude_none=True),
        Dumper=_FlowListDumper,
        sort_keys=False,
        width=100,
        allow_unicode=True,
    )
    Path(path).write_text(header + body, encoding="utf-8")


def packaged_profile_paths() -> tuple[Path, ...]:
    root = resources.files("qlm.engine.profiling") / "profiles"
    return tuple(sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".yaml")))


@functools.cache
def packaged_profiles() -> tuple[Profile, ...]:
    """The profiles shipped in qlm/engine/profiling/profiles, sorted by (model, gpu_type)."""
    profiles = [load_profile(path) for path in packaged_profile_paths()]
    keys = [p.key for p in profiles]
    if len(keys) != len(set(keys)):
        raise ValueError(f"packaged profiles repeat a (model, gpu_type): {sorted(keys)}")
    return tuple(sorted(profiles, key=lambda p: p.key))


def profile_named(model: str, gpu_type: str) -> Profile:
    """The packaged profile of a model on a GPU type; KeyError lists the known pairs."""
    found: Mapping[tuple[str, str], Profile] = {p.key: p for p in packaged_profiles()}
    try:
        return found[(model, gpu_type)]
    except KeyError:
        known = ", ".join(f"{m}@{g}" for m, g in sorted(found))
        raise KeyError(f"no packaged profile for {model}@{gpu_type}; known: {known}") from None


class _FlowListDumper(yaml.SafeDumper):
    """Lists of scalars on one line; everything else in block style."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = all(not isinstance(x, dict | list) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_FlowListDumper.add_representer(list, _represent_list)
