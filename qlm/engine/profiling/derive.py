"""How the packaged profiles (qlm/engine/profiling/profiles/*.yaml) are derived, as code.

    python -m qlm.engine.profiling.derive SPLITWISE_CSV AZURE_CONV_CSV OUT_DIR

rewrites the packaged files from the public data in sims/data (NOTICE there: sources and
licences), from the figures in public_figures.py:

* Llama-70B on 4 x A100 and 4 x H100: step-time model fitted (calibration.py) to the medians of
  the Splitwise measurements of Llama2-70B at tensor parallel 4.
* Mistral-7B on A100: Preble's SGLang forward-time equations.
* Vicuna-13B on A100: Mistral-7B on A100 scaled by model size (weights, KV bytes).
* H100 (7B, 13B): the A100 numbers times the H100/A100 ratios of the Llama2-70B TP4 fits.
* A10 (7B only): the A100 numbers scaled by datasheet memory bandwidth and FP16 FLOPS.
* Output lengths: mean and standard deviation of the Azure 2023 conversation trace.

Skipped: Vicuna-13B on one A10 (26 GB of weights > 24 GB), Llama-70B on A10 (no measurements,
needs 8 GPUs) and on fewer than 4 A100/H100 (the QLM fleets use TP4; TP2 leaves little KV room).
Every file records, field by field, what was measured (by whom) and what derived (how).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from qlm.config.profile_files import (
    FieldSource,
    ProfileFile,
    Provenance,
    StepTimeConfig,
    write_profile_file,
)
from qlm.engine.profiling.calibration import StepTimeFit
from qlm.engine.profiling.public_figures import (
    BANDWIDTH_BYTES_PER_S,
    FP16_FLOPS,
    GPU_COUNT_REASON,
    GPU_MEMORY_UTILIZATION,
    HOST_TO_GPU_BYTES_PER_S,
    MAX_BATCH_SIZE,
    MIN_KV_TOKENS,
    MODELS,
    NVME_BYTES_PER_S,
    PREBLE_A6000_ATTENTION_S,
    PREBLE_INTERCEPT_S,
    PREBLE_PER_TOKEN_S,
    PREBLE_SMALL_STEP_S,
    PROCESS_START_S,
    REFERENCES,
    WAKE_START_S,
    ModelSpec,
    Traffic,
    azure_traffic,
    llama70b_fits,
)
from qlm.perf.step import StepTime

SIG_DIGITS = 4


@dataclass(frozen=True, slots=True)
class Derived:
    """A profile file to write, and its file name."""

    name: str
    file: ProfileFile


def derive(splitwise_csv: Path, azure_csv: Path) -> list[Derived]:
    traffic = azure_traffic(azure_csv)
    fits = llama70b_fits(splitwise_csv)
    ctx = traffic.typical_context_tokens
    mistral_a100 = _mistral_a100()
    vicuna_a100 = _scale_model(mistral_a100, MODELS["mistral-7b"], MODELS["vicuna-13b"], "A100")
    ratios = _h100_ratios(fits, ctx)
    out = [
        _file("mistral-7b", "A100", 1, mistral_a100, traffic, _mistral_a100_sources()),
        _file("vicuna-13b", "A100", 1, vicuna_a100, traffic, _vicuna_sources()),
        _file(
            "mistral-7b",
            "A10",
            1,
            _a10(mistral_a100, MODELS["mistral-7b"]),
            traffic,
            _a10_sources(),
        ),
    ]
    for model, a100 in (("mistral-7b", mistral_a100), ("vicuna-13b", vicuna_a100)):
        h100 = _times(a100, ratios)
        out.append(_file(model, "H100", 1, h100, traffic, _h100_sources(ratios, ctx)))
    for gpu, fit in fits.items():
        out.append(_file("llama-70b", gpu, 4, fit.step_time, traffic, _fit_sources(gpu, fit)))
    return out


# ---------------------------------------------------------------- step-time derivations


def _mistral_a100() -> StepTime:
    at_256_s = PREBLE_INTERCEPT_S + PREBLE_PER_TOKEN_S * 256
    return StepTime(
        base_s=PREBLE_SMALL_STEP_S,
        per_prefill_token_s=PREBLE_PER_TOKEN_S,
        per_decode_seq_s=(at_256_s - PREBLE_SMALL_STEP_S) / 255.0,
        per_context_token_s=PREBLE_A6000_ATTENTION_S
        * BANDWIDTH_BYTES_PER_S["A6000"]
        / BANDWIDTH_BYTES_PER_S["A100"],
    )


def _overhead_s(step: StepTime, facts: ModelSpec, gpu: str) -> float:
    """The part of base_s that is not reading the weights once."""
    return step.base_s - facts.weight_bytes / BANDWIDTH_BYTES_PER_S[gpu]


def _scale_model(step: StepTime, src: ModelSpec, dst: ModelSpec, gpu: str) -> StepTime:
    """Compute scales with weights (parameters), attention with KV bytes, the base with the
    weights read once per step plus the same fixed overhead."""
    size = dst.weight_bytes / src.weight_bytes
    return StepTime(
        base_s=dst.weight_bytes / BANDWIDTH_BYTES_PER_S[gpu] + _overhead_s(step, src, gpu),
        per_prefill_token_s=step.per_prefill_token_s * size,
        per_decode_seq_s=step.per_decode_seq_s * size,
        per_context_token_s=step.per_context_token_s
        * dst.kv_bytes_per_token
        / src.kv_bytes_per_token,
    )


def _a10(a100: StepTime, facts: ModelSpec) -> StepTime:
    compute = FP16_FLOPS["A100"] / FP16_FLOPS["A10"]
    memory = BANDWIDTH_BYTES_PER_S["A100"] / BANDWIDTH_BYTES_PER_S["A10"]
    return StepTime(
        base_s=facts.weight_bytes / BANDWIDTH_BYTES_PER_S["A10"] + _overhead_s(a100, facts, "A100"),
        per_prefill_token_s=a100.per_prefill_token_s * compute,
        per_decode_seq_s=a100.per_decode_seq_s * compute,
        per_context_token_s=a100.per_context_token_s * memory,
    )


@dataclass(frozen=True, slots=True)
class _Ratios:
    base: float
    prefill: float
    decode: float


def _h100_ratios(fits: dict[str, StepTimeFit], ctx: int) -> _Ratios:
    a, h = fits["A100"].step_time, fits["H100"].step_time
    per_seq_a = a.per_decode_seq_s + a.per_context_token_s * ctx
    per_seq_h = h.per_decode_seq_s + h.per_context_token_s * ctx
    return _Ratios(
        base=h.base_s / a.base_s,
        prefill=h.per_prefill_token_s / a.per_prefill_token_s,
        decode=per_seq_h / per_seq_a,
    )


def _times(step: StepTime, r: _Ratios) -> StepTime:
    return StepTime(
        base_s=step.base_s * r.base,
        per_prefill_token_s=step.per_prefill_token_s * r.prefill,
        per_decode_seq_s=step.per_decode_seq_s * r.decode,
        per_context_token_s=step.per_context_token_s * r.decode,
    )


# ---------------------------------------------------------------- files and provenance


def _file(
    model: str,
    gpu: str,
    gpu_count: int,
    step: StepTime,
    traffic: Traffic,
    step_sources: dict[str, FieldSource],
) -> Derived:
    facts = MODELS[model]
    step = _rounded(step)
    spec = ProfileFile(
        model=model,
        gpu_type=gpu,
        gpu_count=gpu_count,
        weight_bytes=facts.weight_bytes,
        kv_bytes_per_token=facts.kv_bytes_per_token,
        step_time=StepTimeConfig(
            base_s=step.base_s,
            per_prefill_token_s=step.per_prefill_token_s,
            per_decode_seq_s=step.per_decode_seq_s,
            per_context_token_s=step.per_context_token_s,
        ),
        typical_context_tokens=traffic.typical_context_tokens,
        output_tokens_mean=round(traffic.output_mean, 1),
        output_tokens_std=round(traffic.output_std, 1),
        load_s=round(PROCESS_START_S + facts.weight_bytes / NVME_BYTES_PER_S, 1),
        wake_s=round(WAKE_START_S + facts.weight_bytes / gpu_count / HOST_TO_GPU_BYTES_PER_S, 1),
        max_batch_size=MAX_BATCH_SIZE,
        min_kv_tokens=MIN_KV_TOKENS,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        provenance=Provenance(
            summary=f"{model} on {gpu_count} x {gpu}: derived by "
            "qlm/engine/profiling/derive.py from public figures; nothing here was measured by QLM",
            fields={**_common_sources(facts, traffic), **step_sources},
            references=REFERENCES,
        ),
    )
    profile = spec.to_profile()
    table = tuple(round(s, 7) for s in profile.decode_step_s)
    profile = replace(
        profile, decode_step_s=table, prefill_tokens_per_s=_sig(profile.prefill_tokens_per_s, 6)
    )
    written = ProfileFile.of(profile, spec.provenance, traffic.typical_context_tokens)
    return Derived(f"{model}_{gpu}.yaml", written)


def _rounded(step: StepTime) -> StepTime:
    return StepTime(
        _sig(step.base_s),
        _sig(step.per_prefill_token_s),
        _sig(step.per_decode_seq_s),
        _sig(step.per_context_token_s),
    )


def _sig(x: float, digits: int = SIG_DIGITS) -> float:
    if x == 0:
        return 0.0
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def _src(kind: str, source: str) -> FieldSource:
    return FieldSource.model_validate({"kind": kind, "source": source})


def _common_sources(facts: ModelSpec, traffic: Traffic) -> dict[str, FieldSource]:
    ctx = traffic.typical_context_tokens
    return {
        "weight_bytes": _src("published", "configs: parameters x 2 bytes (FP16)"),
        "kv_bytes_per_token": _src(
            "derived",
            f"configs: layers x KV heads x head dim x 2 (K, V) x 2 bytes = {facts.config}",
        ),
        "typical_context_tokens": _src(
            "derived",
            f"azure: mean context {traffic.context_mean:.1f} + half the mean output "
            f"{traffic.output_mean:.1f} = {ctx} tokens held while decoding",
        ),
        "decode_table": _src(
            "derived",
            f"step_time at typical_context_tokens ({ctx}): base + (per_decode_seq + "
            f"{ctx} x per_context_token) x batch",
        ),
        "prefill_tokens_per_s": _src(
            "derived", "1 / (per_prefill_token_s + per_context_token_s) (one-chunk prefill)"
        ),
        "output_tokens_mean": _src("measured", "azure: mean GeneratedTokens"),
        "output_tokens_std": _src("measured", "azure: population std of GeneratedTokens"),
        "load_s": _src(
            "derived",
            f"load: {PROCESS_START_S:.0f} s process start + weights at "
            f"{NVME_BYTES_PER_S / 1e9:.0f} GB/s",
        ),
        "wake_s": _src(
            "derived",
            f"sleep: {WAKE_START_S} s + each GPU's weight shard from host memory at "
            f"{HOST_TO_GPU_BYTES_PER_S / 1e9:.0f} GB/s (PCIe 4.0 x16)",
        ),
        "max_batch_size": _src("published", "vllm: default max_num_seqs 256"),
        "gpu_memory_utilization": _src("published", "vllm: default 0.9"),
        "min_kv_tokens": _src("assumed", "QLM default: at least 4096 KV tokens to serve"),
        "gpu_count": _src("assumed", GPU_COUNT_REASON[facts.name]),
    }


def _mistral_a100_sources() -> dict[str, FieldSource]:
    return {
        "step_time.base_s": _src(
            "measured",
            "preble: ~9-10.5 ms per step below 256 tokens; 9.0 ms taken for one "
            "sequence (llm-d reports 15-25 ms ITL for vLLM, which adds serving overhead)",
        ),
        "step_time.per_prefill_token_s": _src("measured", "preble: 0.0503 ms per batched token"),
        "step_time.per_decode_seq_s": _src(
            "derived",
            "preble: line from 9.0 ms at 1 sequence to 0.0503 x 256 + 5.51 = 18.39 ms at 256",
        ),
        "step_time.per_context_token_s": _src(
            "derived",
            "preble: A6000 attention 1.86e-4 ms per context token x 768 / 2039 "
            "(datasheets: memory bandwidth A6000 / A100)",
        ),
    }


def _vicuna_sources() -> dict[str, FieldSource]:
    how = "Mistral-7B on A100 scaled by"
    return {
        "step_time.base_s": _src(
            "derived",
            "26 GB / 2039 GB/s (weights read once) + the Mistral-7B A100 overhead "
            "(9.0 ms - 14.5 GB / 2039 GB/s)",
        ),
        "step_time.per_prefill_token_s": _src("derived", f"{how} weights 26 / 14.5"),
        "step_time.per_decode_seq_s": _src("derived", f"{how} weights 26 / 14.5"),
        "step_time.per_context_token_s": _src("derived", f"{how} KV bytes 800 / 128 KiB"),
    }


def _a10_sources() -> dict[str, FieldSource]:
    how = "Mistral-7B on A100 scaled by datasheets:"
    return {
        "step_time.base_s": _src(
            "derived",
            "14.5 GB / 600 GB/s (weights read once) + the A100 overhead "
            "(9.0 ms - 14.5 GB / 2039 GB/s)",
        ),
        "step_time.per_prefill_token_s": _src("derived", f"{how} FP16 FLOPS 312 / 125"),
        "step_time.per_decode_seq_s": _src("derived", f"{how} FP16 FLOPS 312 / 125"),
        "step_time.per_context_token_s": _src("derived", f"{how} bandwidth 2039 / 600"),
    }


def _h100_sources(r: _Ratios, ctx: int) -> dict[str, FieldSource]:
    how = "the A100 profile's coefficient x the H100/A100 ratio of the Llama2-70B TP4 fits"
    return {
        "step_time.base_s": _src("derived", f"{how} (splitwise): base {r.base:.3f}"),
        "step_time.per_prefill_token_s": _src(
            "derived", f"{how} (splitwise): prefill {r.prefill:.3f}"
        ),
        "step_time.per_decode_seq_s": _src(
            "derived", f"{how} (splitwise): per decoding sequence at {ctx} tokens {r.decode:.3f}"
        ),
        "step_time.per_context_token_s": _src(
            "derived", f"{how} (splitwise): per decoding sequence at {ctx} tokens {r.decode:.3f}"
        ),
    }


def _fit_sources(gpu: str, fit: StepTimeFit) -> dict[str, FieldSource]:
    how = (
        f"splitwise: non-negative least-squares fit (relative error) to the medians of "
        f"Llama2-70B TP4 on {gpu}, prompt rows up to 4096 tokens and all token rows; "
        f"{fit.samples} points, rms error {fit.rms_relative_error:.1%}, "
        f"max {fit.max_relative_error:.1%}"
    )
    return {
        name: _src("measured", how)
        for name in (
            "step_time.base_s",
            "step_time.per_prefill_token_s",
            "step_time.per_decode_seq_s",
            "step_time.per_context_token_s",
        )
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        print(__doc__)
        return 2
    splitwise, azure, out_dir = (Path(a) for a in args)
    for item in derive(splitwise, azure):
        path = out_dir / item.name
        write_profile_file(item.file, path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
