"""A measured profile: what a profiling run returns, the fit over its samples, and the file.

Question answered: how does a profiling run become a profile file? `ProfileRun` is everything
the live driver (vllm_profiler.py) measured; `fit_profile` fits the step-time formula to its
samples (calibration.fit_step_time over the median of each probe's repeats) and reports the
fit's quality; `build_profile_file` writes the profile (qlm/config/profile_files.py format)
with every number's provenance: the step model, load time and KV figures `measured`, the rest
saying how it was chosen, and a `measurement` section with the run itself. Pure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qlm.config.profile_files import (
    FieldSource,
    FitQuality,
    MeasuredIteration,
    Measurement,
    ProfileFile,
    Provenance,
    StepTimeConfig,
)
from qlm.engine.profiling.calibration import StepSample, StepTimeFit, fit_step_time
from qlm.engine.profiling.probes import LabeledSample, ProfileGrid, SampleKind
from qlm.engine.vllm.metrics import KvFacts


@dataclass(frozen=True, slots=True)
class ProfileFit:
    """The fitted step model and each sample beside its prediction."""

    fit: StepTimeFit
    samples: tuple[LabeledSample, ...]

    def rows(self) -> tuple[MeasuredIteration, ...]:
        return tuple(
            MeasuredIteration(
                kind=s.kind.value,
                prefill_tokens=s.sample.prefill_tokens,
                decode_seqs=s.sample.decode_seqs,
                context_tokens=s.sample.context_tokens,
                measured_s=s.sample.iteration_s,
                predicted_s=self.fit.predicted_s(s.sample),
            )
            for s in self.samples
        )

    def quality(self) -> FitQuality:
        r2 = self.fit.r_squared
        return FitQuality(
            samples=self.fit.samples,
            r_squared=None if math.isnan(r2) else r2,
            max_relative_error=self.fit.max_relative_error,
            rms_relative_error=self.fit.rms_relative_error,
        )

    def quality_by_kind(self) -> dict[str, tuple[int, float]]:
        """Per probe kind: (samples, max relative error)."""
        out: dict[str, tuple[int, float]] = {}
        for kind in SampleKind:
            errs = [
                abs(self.fit.predicted_s(s.sample) / s.sample.iteration_s - 1.0)
                for s in self.samples
                if s.kind is kind
            ]
            if errs:
                out[str(kind)] = (len(errs), max(errs))
        return out


def fit_profile(samples: Sequence[LabeledSample]) -> ProfileFit:
    """Non-negative least squares on relative error (calibration.fit_step_time) over the
    median of each probe's repeats (a busy host makes single measurements spiky). ValueError
    when the samples cannot give positive base and prefill coefficients."""
    merged = merge_repeats(samples)
    fit = fit_step_time([s.sample for s in merged])
    return ProfileFit(fit, merged)


def merge_repeats(samples: Sequence[LabeledSample]) -> tuple[LabeledSample, ...]:
    """One sample per probe and kind (labels equal but for the repeat): the median time at
    the mean shape, in first-seen order."""
    groups: dict[tuple[SampleKind, str], list[StepSample]] = {}
    for s in samples:
        label = s.sample.label.replace(f" #{_repeat_of(s.sample.label)}", "", 1)
        groups.setdefault((s.kind, label), []).append(s.sample)
    return tuple(
        LabeledSample(
            kind,
            StepSample(
                statistics.fmean(x.prefill_tokens for x in group),
                statistics.fmean(x.decode_seqs for x in group),
                statistics.fmean(x.context_tokens for x in group),
                statistics.median(x.iteration_s for x in group),
                f"{label} (median of {len(group)})" if len(group) > 1 else label,
            ),
        )
        for (kind, label), group in groups.items()
    )


def _repeat_of(label: str) -> str:
    """The repeat number in a probe label ("... #2 decode" -> "2"); "" when none."""
    for word in label.split():
        if word.startswith("#") and word[1:].isdigit():
            return word[1:]
    return ""


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """The served model and its engine, as measured."""

    name: str
    path: str
    weight_bytes: int  # weight files on disk
    kv: KvFacts
    max_num_seqs: int


@dataclass(frozen=True, slots=True)
class ProfileTarget:
    """What the profile is for and the workload facts a profile carries but an engine cannot
    measure (output lengths are the traffic's, not the engine's)."""

    gpu_type: str
    gpu_memory_bytes: int
    output_tokens_mean: float = 211.1
    output_tokens_std: float = 162.9
    typical_context_tokens: int | None = None  # None: the decode probes' median
    gpu_count: int = 1


@dataclass(frozen=True, slots=True)
class ProfileRun:
    """Everything a live profiling run measured (the driver's result)."""

    facts: ModelFacts
    grid: ProfileGrid
    samples: tuple[LabeledSample, ...]
    load_s: tuple[float, ...]
    overhead_s: tuple[float, ...]  # client TTFT - engine prefill, per prefill probe
    engine: str
    engine_settings: Mapping[str, str | int | float | bool | None]
    measured_at: str
    host: str
    load_average: tuple[float, float, float]
    wall_s: float
    skipped: tuple[str, ...] = ()  # probes that never got a clean window
    wake_s: tuple[float, ...] = ()  # switches back to a standby server (the standby tier)


def typical_context(samples: Sequence[LabeledSample]) -> int:
    """Median tokens per decoding sequence over the decode probes."""
    per_seq = [
        s.sample.context_tokens / s.sample.decode_seqs
        for s in samples
        if s.kind is SampleKind.DECODE and s.sample.decode_seqs > 0
    ]
    if not per_seq:
        raise ValueError("no decode samples: cannot choose a typical context")
    return max(1, round(statistics.median(per_seq)))


def gpu_memory_utilization(facts: ModelFacts, gpu_memory_bytes: int, gpu_count: int = 1) -> float:
    """The share of the instance's memory that makes Profile.kv_capacity_tokens give the
    engine's measured KV capacity (half a token of slack against rounding)."""
    need = facts.weight_bytes + (facts.kv.capacity_tokens + 0.5) * facts.kv.bytes_per_token
    share = need / (gpu_memory_bytes * gpu_count)
    if share > 1.0:
        raise ValueError(
            f"weights + KV cache ({need / 2**30:.2f} GiB) exceed the GPU memory "
            f"({gpu_count} x {gpu_memory_bytes / 2**30:.2f} GiB): give the real memory"
        )
    return share


def build_profile_file(run: ProfileRun, fit: ProfileFit, target: ProfileTarget) -> ProfileFile:
    """The profile file of a measured engine, every number with its provenance."""
    st = fit.fit.step_time
    facts = run.facts
    typical = target.typical_context_tokens or typical_context(run.samples)
    spec = ProfileFile(
        model=facts.name,
        gpu_type=target.gpu_type,
        gpu_count=target.gpu_count,
        weight_bytes=facts.weight_bytes,
        kv_bytes_per_token=facts.kv.bytes_per_token,
        step_time=StepTimeConfig(
            base_s=st.base_s,
            per_prefill_token_s=st.per_prefill_token_s,
            per_decode_seq_s=st.per_decode_seq_s,
            per_context_token_s=st.per_context_token_s,
        ),
        typical_context_tokens=typical,
        output_tokens_mean=target.output_tokens_mean,
        output_tokens_std=target.output_tokens_std,
        load_s=statistics.median(run.load_s),
        wake_s=statistics.median(run.wake_s) if run.wake_s else None,
        max_batch_size=facts.max_num_seqs,
        min_kv_tokens=min(4096, facts.kv.capacity_tokens),
        gpu_memory_utilization=gpu_memory_utilization(
            facts, target.gpu_memory_bytes, target.gpu_count
        ),
        provenance=_provenance(run, fit, target, typical),
        measurement=Measurement(
            tool="qlm profile",
            engine=run.engine,
            model_path=facts.path,
            measured_at=run.measured_at,
            host=run.host,
            load_average=run.load_average,
            wall_s=run.wall_s,
            engine_settings=dict(run.engine_settings),
            grid=run.grid.summary(),
            load_s_samples=run.load_s,
            wake_s_samples=run.wake_s,
            skipped_probes=run.skipped,
            request_overhead_s=statistics.median(run.overhead_s) if run.overhead_s else None,
            fit=fit.quality(),
            iterations=fit.rows(),
        ),
    )
    return spec


def _provenance(
    run: ProfileRun, fit: ProfileFit, target: ProfileTarget, typical: int
) -> Provenance:
    fields = {**_measured_sources(run, fit), **_chosen_sources(run, target, typical)}
    return Provenance(
        summary=f"{run.facts.name} on {target.gpu_count} x {target.gpu_type}: measured by "
        f"qlm profile on {run.engine}, {run.measured_at}",
        fields=fields,
        references={
            "qlm-profile": f"qlm profile on {run.host or 'this host'} at {run.measured_at} "
            f"(load average {run.load_average[0]:.2f} at the end)"
        },
    )


def _measured_sources(run: ProfileRun, fit: ProfileFit) -> dict[str, FieldSource]:
    """The fields the run measured: the step model, the load time, weights and KV bytes."""
    q = fit.quality()
    r2 = "n/a" if q.r_squared is None else f"{q.r_squared:.4f}"
    step_src = (
        f"qlm-profile: NNLS fit to {q.samples} iterations (R^2 {r2}, max relative error "
        f"{q.max_relative_error:.1%}); see measurement"
    )
    measured = {
        f"step_time.{name}": FieldSource(kind="measured", source=step_src)
        for name in ("base_s", "per_prefill_token_s", "per_decode_seq_s", "per_context_token_s")
    }
    loads = ", ".join(f"{x:.1f}" for x in run.load_s)
    wakes = ", ".join(f"{x:.2f}" for x in run.wake_s)
    if run.wake_s:
        measured["wake_s"] = FieldSource(
            kind="measured",
            source=f"qlm-profile: median of {len(run.wake_s)} switches back to a standby "
            f"server (park, then /health ready: {wakes} s)",
        )
    return {
        **measured,
        "load_s": FieldSource(
            kind="measured",
            source=f"qlm-profile: median of {len(run.load_s)} loads (process start or restart "
            f"to /health ready: {loads} s)",
        ),
        "weight_bytes": FieldSource(
            kind="measured", source="qlm-profile: size of the model folder's weight files"
        ),
        "kv_bytes_per_token": FieldSource(
            kind="measured",
            source="qlm-profile: vLLM cache_config_info, KV cache bytes / (blocks x block size)",
        ),
    }


def _chosen_sources(run: ProfileRun, target: ProfileTarget, typical: int) -> dict[str, FieldSource]:
    """The fields given to qlm profile, assumed, or derived from the measured ones."""
    return {
        "max_batch_size": FieldSource(
            kind="assumed", source="the engine's max_num_seqs while profiling"
        ),
        "gpu_memory_utilization": FieldSource(
            kind="derived",
            source=f"weights + vLLM's usable KV blocks ({run.facts.kv.capacity_tokens} tokens) "
            f"over {target.gpu_count} x {target.gpu_memory_bytes} bytes",
        ),
        "typical_context_tokens": FieldSource(
            kind="assumed" if target.typical_context_tokens else "derived",
            source="given to qlm profile"
            if target.typical_context_tokens
            else "median tokens per sequence of the decode probes",
        ),
        "decode_table": FieldSource(
            kind="derived", source=f"the step model at {typical} tokens per sequence"
        ),
        "prefill_tokens_per_s": FieldSource(
            kind="derived", source="1 / (per_prefill_token_s + per_context_token_s)"
        ),
        "output_tokens_mean": FieldSource(
            kind="assumed", source="given to qlm profile (the traffic's, not the engine's)"
        ),
        "output_tokens_std": FieldSource(
            kind="assumed", source="given to qlm profile (the traffic's, not the engine's)"
        ),
        "min_kv_tokens": FieldSource(kind="assumed", source="4096, or the whole KV cache"),
        "gpu_count": FieldSource(kind="assumed", source="given to qlm profile"),
    }
