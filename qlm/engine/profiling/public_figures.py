"""The public figures the packaged profiles are derived from (derive.py does the deriving).

Question answered: which published or measured numbers do the packaged profiles start from, and
where does each come from? References (cited by name in every file's provenance), datasheet
bandwidth and FLOPS, model configs, vLLM defaults, Preble's equations, and the readers of the
public data in sims/data (NOTICE there): the Azure conversation trace's output and
context lengths, and the Splitwise measurements of Llama2-70B fitted with calibration.py.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from qlm.engine.profiling.calibration import StepTimeFit, fit_step_time, splitwise_samples

REFERENCES: dict[str, str] = {
    "splitwise": "Mutinifni/splitwise-sim data/perf_model.csv (MIT): measured Llama2-70B prompt "
    "and per-token times on A100-80GB and H100-80GB (Patel et al., Splitwise, ISCA'24)",
    "preble": "Preble model_equations.py (Srivatsa et al., 2024): SGLang forward time of "
    "Mistral-7B on A100, 0.0503 ms x batched tokens + 5.51 ms (>= 256 tokens), ~9-10.5 ms "
    "below; on A6000 decode attention 1.86e-4 ms per context token",
    "azure": "Azure LLM inference trace 2023, conversation (Azure/AzurePublicDataset, "
    "CC-BY-4.0), 19,366 requests",
    "datasheets": "NVIDIA datasheets: A10 24 GB, 600 GB/s, 125 TFLOPS FP16; A100-80GB "
    "2,039 GB/s, 312 TFLOPS; H100-80GB SXM 3,350 GB/s, 989 TFLOPS; RTX A6000 768 GB/s",
    "configs": "Hugging Face model configs: Mistral-7B (32 layers, 8 KV heads x 128), "
    "Vicuna-13B (40 layers, 40 heads x 128), Llama-2-70B (80 layers, 8 KV heads x 128); FP16",
    "vllm": "vLLM defaults: max_num_seqs 256, gpu_memory_utilization 0.9",
    "load": "model load: a fresh vLLM process takes 10-60 s before serving; weights stream "
    "from NVMe at 5-7 GB/s (ServerlessLLM), see qlm/engine/profiling/README.md",
    "llm-d": "llm-d-inference-sim docs/latency-profiles.md batch-1 figures (cross-check only)",
    "sleep": "vLLM sleep mode (docs.vllm.ai features/sleep_mode; vLLM blog 2025-10-26): level 1 "
    "keeps the weights in CPU RAM and wakes 18-200x faster than a reload, 0.1-6 s",
}

BANDWIDTH_BYTES_PER_S = {"A10": 600e9, "A100": 2039e9, "H100": 3350e9, "A6000": 768e9}
FP16_FLOPS = {"A10": 125e12, "A100": 312e12, "H100": 989e12}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    weight_bytes: int
    kv_bytes_per_token: int
    config: str  # where the two numbers come from


MODELS = {
    "mistral-7b": ModelSpec("mistral-7b", 14_500_000_000, 32 * 8 * 128 * 2 * 2, "32x8x128x2x2"),
    "vicuna-13b": ModelSpec("vicuna-13b", 26_000_000_000, 40 * 40 * 128 * 2 * 2, "40x40x128x2x2"),
    "llama-70b": ModelSpec("llama-70b", 138_000_000_000, 80 * 8 * 128 * 2 * 2, "80x8x128x2x2"),
}

GPU_COUNT_REASON = {
    "mistral-7b": "one GPU: weights and ample KV fit on any of the three types",
    "vicuna-13b": "one GPU: fits A100 and H100, not A10 (26 GB > 24 GB)",
    "llama-70b": "tensor parallel 4, as measured by Splitwise; TP2 leaves little KV room",
}
PROCESS_START_S = 20.0  # within the 10-60 s reported for a fresh vLLM process
NVME_BYTES_PER_S = 6e9  # ServerlessLLM's 5-7 GB/s
WAKE_START_S = 0.5  # sleep mode keeps the process, allocator and graphs: wake is a copy
HOST_TO_GPU_BYTES_PER_S = 25e9  # PCIe 4.0 x16, per GPU (tensor-parallel shards copy at once)
MAX_BATCH_SIZE = 256
GPU_MEMORY_UTILIZATION = 0.9
MIN_KV_TOKENS = 4096

# Mistral-7B on A100 (Preble): step at one decoding sequence, the line above 256 tokens.
PREBLE_SMALL_STEP_S = 9.0e-3  # lower end of "~9-10.5 ms below 256 tokens": one sequence
PREBLE_PER_TOKEN_S = 0.0503e-3
PREBLE_INTERCEPT_S = 5.51e-3
PREBLE_A6000_ATTENTION_S = 1.86e-7  # per context token


@dataclass(frozen=True, slots=True)
class Traffic:
    output_mean: float
    output_std: float
    context_mean: float

    @property
    def typical_context_tokens(self) -> int:
        """Tokens a sequence holds on average while decoding: prompt + half its output."""
        return round(self.context_mean + self.output_mean / 2.0)


def azure_traffic(path: Path) -> Traffic:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    out = [float(r["GeneratedTokens"]) for r in rows]
    ctx = [float(r["ContextTokens"]) for r in rows]
    return Traffic(statistics.fmean(out), statistics.pstdev(out), statistics.fmean(ctx))


def llama70b_fits(path: Path) -> dict[str, StepTimeFit]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        gpu: fit_step_time(splitwise_samples(rows, "llama2-70b", hw, 4))
        for gpu, hw in (("A100", "a100-80gb"), ("H100", "h100-80gb"))
    }
