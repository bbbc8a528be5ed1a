"""How a profiling run starts vLLM, and what it reads of the model on disk: the engine's
configuration with the token budget explicit and prefix caching off (`profile_engine_config`:
what is measured is compute, at the chunk size the simulator assumes), the budget a
configuration sets (`token_budget`), and the model's weight bytes (`weight_bytes`). Pure
except `weight_bytes`, which lists the model folder."""

from __future__ import annotations

from pathlib import Path

from qlm.config.vllm_config import VllmEngineConfig
from qlm.engine.profiling.probe_client import ProfilingError

VLLM_DEFAULT_TOKEN_BUDGET = 2048  # vLLM 0.32 SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def profile_engine_config(
    config: VllmEngineConfig, max_num_batched_tokens: int = VLLM_DEFAULT_TOKEN_BUDGET
) -> VllmEngineConfig:
    """The config with the token budget given explicitly and prefix caching off (unless the
    extra arguments already say otherwise)."""
    extra = list(config.extra_args)
    if not any(a.startswith("--max-num-batched-tokens") for a in extra):
        extra += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    if not any("prefix-caching" in a for a in extra):
        extra.append("--no-enable-prefix-caching")
    return config.model_copy(update={"extra_args": tuple(extra)})


def token_budget(config: VllmEngineConfig) -> int:
    """max_num_batched_tokens as the config's extra arguments set it (else vLLM's default)."""
    args = list(config.extra_args)
    for i, arg in enumerate(args):
        if arg.startswith("--max-num-batched-tokens="):
            return int(arg.partition("=")[2])
        if arg == "--max-num-batched-tokens" and i + 1 < len(args):
            return int(args[i + 1])
    return VLLM_DEFAULT_TOKEN_BUDGET


def weight_bytes(model_dir: Path) -> int:
    """Bytes of the weight files in a Hugging Face model folder."""
    total = sum(p.stat().st_size for p in model_dir.rglob("*") if p.suffix in WEIGHT_SUFFIXES)
    if total <= 0:
        raise ProfilingError(f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) in {model_dir}")
    return total
