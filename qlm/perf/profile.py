"""The engine performance model: one Profile per (model, GPU type).

The estimator, the simulated engine and the emulated engine all read these numbers, so
there is one answer to "how fast is model M on GPU G". The estimator interpolates a table of
decode step time by batch size; the engines time each iteration with the optional linear
step-time model (`StepTime`, step.py) and fall back to the table when a profile has none.
Packaged profiles derive their table from their step-time model at a stated typical context
length, so both views agree.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

from qlm.perf.step import DecodeRun, StepTime

GIB = 1024**3
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of GPU memory


@dataclass(frozen=True, slots=True)
class Profile:
    """Performance of one model on one GPU type at a given tensor-parallel degree.

    decode_batch_sizes and decode_step_s are parallel, increasing in batch size:
    decode_step_s[i] is the time of one decode iteration that advances decode_batch_sizes[i]
    sequences by one token each. step_time, when present, times any iteration (prefill chunks,
    decodes, context; see step.py) and is what the engines use; the table is then its value at
    a typical context length (see qlm/config/profile_files.py).
    """

    model: str
    gpu_type: str
    gpu_count: int
    weight_bytes: int
    kv_bytes_per_token: int
    decode_batch_sizes: tuple[int, ...]
    decode_step_s: tuple[float, ...]
    prefill_tokens_per_s: float
    output_tokens_mean: float
    output_tokens_std: float
    load_s: float
    max_batch_size: int = 256
    min_kv_tokens: int = 4096
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    provenance: str = ""
    step_time: StepTime | None = None
    # The standby tier: seconds to serve again a model that sleeps on the instance (weights
    # in host memory: vLLM sleep mode level 1, or a co-resident standby server). None: this
    # (model, GPU) has no standby tier; every load is a cold one (load_s).
    wake_s: float | None = None

    def __post_init__(self) -> None:
        _require(self.gpu_count >= 1, "gpu_count must be >= 1")
        _require(self.weight_bytes > 0, "weight_bytes must be > 0")
        _require(self.kv_bytes_per_token > 0, "kv_bytes_per_token must be > 0")
        _require(len(self.decode_batch_sizes) >= 1, "decode table needs at least one row")
        _require(
            len(self.decode_batch_sizes) == len(self.decode_step_s),
            "decode_batch_sizes and decode_step_s differ in length",
        )
        _require(
            list(self.decode_batch_sizes) == sorted(set(self.decode_batch_sizes)),
            "decode_batch_sizes must be strictly increasing",
        )
        _require(min(self.decode_batch_sizes) >= 1, "decode batch sizes must be >= 1")
        _require(min(self.decode_step_s) > 0, "decode step times must be > 0")
        _require(
            all(a <= b for a, b in zip(self.decode_step_s, self.decode_step_s[1:], strict=False)),
            "decode_step_s must not decrease with batch size",
        )
        _require(self.prefill_tokens_per_s > 0, "prefill_tokens_per_s must be > 0")
        _require(self.output_tokens_mean > 0, "output_tokens_mean must be > 0")
        _require(self.output_tokens_std >= 0, "output_tokens_std must be >= 0")
        _require(self.load_s >= 0, "load_s must be >= 0")
        _require(self.wake_s is None or self.wake_s >= 0, "wake_s must be >= 0")
        _require(self.max_batch_size >= 1, "max_batch_size must be >= 1")
        _require(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization in (0, 1]")

    @property
    def key(self) -> tuple[str, str]:
        return (self.model, self.gpu_type)

    def decode_step_s_at(self, batch_size: float) -> float:
        """Decode iteration time at a batch size, interpolated linearly (clamped at the ends,
        extrapolated linearly beyond the last row)."""
        sizes, steps = self.decode_batch_sizes, self.decode_step_s
        if batch_size <= sizes[0] or len(sizes) == 1:
            return steps[0]
        i = bisect.bisect_left(sizes, batch_size)
        if i >= len(sizes):
            i = len(sizes) - 1
        lo_b, hi_b, lo_s, hi_s = sizes[i - 1], sizes[i], steps[i - 1], steps[i]
        return lo_s + (hi_s - lo_s) * (batch_size - lo_b) / (hi_b - lo_b)

    def token_throughput_per_s(self, batch_size: float) -> float:
        """Output tokens per second when batch_size sequences decode together."""
        return batch_size / self.decode_step_s_at(batch_size)

    def prefill_s(self, prompt_tokens: float) -> float:
        return prompt_tokens / self.prefill_tokens_per_s

    def iteration_s(
        self, prefill_tokens: float, decode_seqs: float, context_tokens: float
    ) -> float:
        """Time of one engine iteration (step.py). Without a step-time model: the decode step
        at this batch size (the first table row when nothing decodes) plus the prefill at
        prefill_tokens_per_s; context_tokens is then ignored."""
        if self.step_time is not None:
            return self.step_time.iteration_s(prefill_tokens, decode_seqs, context_tokens)
        return self.decode_step_s_at(decode_seqs) + prefill_tokens / self.prefill_tokens_per_s

    def load_time_s(self, standby: bool) -> float:
        """Seconds until the model serves on an instance: wake_s when it sleeps there
        (`standby`) and the profile has a standby tier, else the cold load_s."""
        return self.wake_s if standby and self.wake_s is not None else self.load_s

    def decode_run(self, decode_seqs: int, context_tokens: int) -> DecodeRun:
        """A run of decode-only iterations of decode_seqs sequences that hold context_tokens
        tokens in all at its start; each step adds decode_seqs tokens of context."""
        first_s = self.iteration_s(0, decode_seqs, context_tokens)
        growth_s = 0.0 if self.step_time is None else self.step_time.per_context_token_s
        return DecodeRun(first_s, growth_s * decode_seqs)

    def slowed(self, factor: float) -> Profile:
        """The profile with every iteration `factor` times as long (the engine's share of a
        GPU that `factor` busy engines take turns on); memory and load times unchanged."""
        _require(factor >= 1, "a slowdown factor must be >= 1")
        if factor == 1:
            return self
        step = self.step_time
        if step is not None:
            coefficients = (step.base_s, step.per_prefill_token_s, step.per_decode_seq_s,
                            step.per_context_token_s)  # fmt: skip
            step = StepTime(*(c * factor for c in coefficients))
        return replace(
            self,
            decode_step_s=tuple(s * factor for s in self.decode_step_s),
            prefill_tokens_per_s=self.prefill_tokens_per_s / factor,
            step_time=step,
        )

    def kv_capacity_tokens(self, gpu_memory_bytes: int) -> int:
        """KV-cache tokens that fit beside the weights on gpu_count GPUs of this memory."""
        usable = self.gpu_memory_utilization * gpu_memory_bytes * self.gpu_count
        return max(0, math.floor((usable - self.weight_bytes) / self.kv_bytes_per_token))

    def fits(self, gpu_memory_bytes: int) -> bool:
        """Weights plus the minimum KV cache fit in the instance's memory."""
        return self.kv_capacity_tokens(gpu_memory_bytes) >= self.min_kv_tokens

    def batch_size_for(self, gpu_memory_bytes: int, context_tokens_mean: float) -> int:
        """Sequences that run concurrently: bounded by KV capacity and max_batch_size."""
        by_kv = self.kv_capacity_tokens(gpu_memory_bytes) // max(1, math.ceil(context_tokens_mean))
        return max(1, min(self.max_batch_size, int(by_kv)))


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
