"""What vLLM's /metrics says: request counts, KV cache use and size, per-request histograms.

Question answered: how do QLM's engine client and profiler read a Prometheus exposition of
vLLM (v1 engine, 0.32)? Pure parsing; scraping is the caller's. The client reads the gauges
(`parse_metrics`): usable KV tokens from cache_config_info ((num_gpu_blocks - 1) x block_size;
vLLM keeps one null block), the share of them in use, and the prefix cache's counters (prompt
tokens looked up and found cached: vLLM caches prefixes by default). The profiler reads the
per-request prefill and decode time histograms (`histogram_totals`, recorded when a request
finishes) and the KV cache's size per token (`kv_facts`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# Per-request histograms (prefill: scheduled -> first token; decode: first -> last token).
PREFILL_TIME = "vllm:request_prefill_time_seconds"
DECODE_TIME = "vllm:request_decode_time_seconds"
HISTOGRAMS = (PREFILL_TIME, DECODE_TIME)
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"  # prompt tokens looked up in the cache
PREFIX_HITS = "vllm:prefix_cache_hits_total"  # of them, found cached
_USAGE_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # 0.32.0, older


@dataclass(frozen=True, slots=True)
class VllmMetrics:
    """What one scrape of vLLM's /metrics said (summed over engines in the server)."""

    num_requests_running: int = 0
    num_requests_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of usable KV blocks in use
    kv_capacity_tokens: int | None = None  # usable KV tokens, from cache_config_info
    generation_tokens_total: int = 0  # counter: tokens generated since the server started
    at_s: float = 0.0
    # Prefix cache counters since the server started: prompt tokens looked up, and found
    # cached (None: this vLLM does not export them)
    prefix_queried_tokens: int | None = None
    prefix_hit_tokens: int | None = None

    @property
    def kv_used_tokens(self) -> int:
        return round(self.kv_cache_usage * (self.kv_capacity_tokens or 0))


# The samples parse_metrics reads (the exposition's histograms are most of its lines)
_GAUGE_SAMPLES = frozenset(
    {
        "vllm:cache_config_info",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:generation_tokens_total",
        PREFIX_QUERIES,
        PREFIX_HITS,
        *_USAGE_GAUGES,
    }
)


def _only(text: str, samples: frozenset[str]) -> str:
    """The exposition's lines for the given sample names (and their families' HELP and TYPE
    lines), so the parser reads a dozen lines, not the hundreds of histogram buckets: the
    engine client parses /metrics several times a second on the control plane's core."""
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            family = line.split(" ", 3)[2] if line.count(" ") >= 2 else ""
            if family and any(name.startswith(family) for name in samples):
                kept.append(line)
        elif line.split("{", 1)[0].split(" ", 1)[0] in samples:
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_metrics(text: str, at_s: float = 0.0) -> VllmMetrics:
    """Read the gauges the client needs from a Prometheus text exposition."""
    values: dict[str, float] = {}  # sample name -> sum over label sets
    capacity: int | None = None
    for family in text_string_to_metric_families(_only(text, _GAUGE_SAMPLES)):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                capacity = (capacity or 0) + _usable_kv_tokens(sample.labels)
            else:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    usage = next((values[name] for name in _USAGE_GAUGES if name in values), 0.0)
    return VllmMetrics(
        num_requests_running=int(values.get("vllm:num_requests_running", 0)),
        num_requests_waiting=int(values.get("vllm:num_requests_waiting", 0)),
        kv_cache_usage=usage,
        kv_capacity_tokens=capacity,
        generation_tokens_total=int(values.get("vllm:generation_tokens_total", 0)),
        at_s=at_s,
        prefix_queried_tokens=_count(values, PREFIX_QUERIES),
        prefix_hit_tokens=_count(values, PREFIX_HITS),
    )


def _count(values: Mapping[str, float], name: str) -> int | None:
    value = values.get(name)
    return None if value is None else int(value)


def _usable_kv_tokens(labels: Mapping[str, str]) -> int:
    with contextlib.suppress(KeyError, ValueError):
        return (int(labels["num_gpu_blocks"]) - 1) * int(labels["block_size"])
    with contextlib.suppress(KeyError, ValueError):
        return int(labels["kv_cache_size_tokens"])
    return 0


@dataclass(frozen=True, slots=True)
class HistogramTotal:
    sum_s: float = 0.0
    count: float = 0.0


def histogram_totals(
    metrics_text: str, names: Sequence[str] = HISTOGRAMS
) -> dict[str, HistogramTotal]:
    """Sum and count of each named histogram in a Prometheus exposition (over label sets)."""
    sums: dict[str, float] = dict.fromkeys(names, 0.0)
    counts: dict[str, float] = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            base, _, suffix = sample.name.rpartition("_")
            if base in sums and suffix == "sum":
                sums[base] += sample.value
            elif base in counts and suffix == "count":
                counts[base] += sample.value
    return {n: HistogramTotal(sums[n], counts[n]) for n in names}


def histogram_delta(
    before: Mapping[str, HistogramTotal], after: Mapping[str, HistogramTotal], name: str
) -> HistogramTotal:
    a, b = before[name], after[name]
    return HistogramTotal(b.sum_s - a.sum_s, b.count - a.count)


@dataclass(frozen=True, slots=True)
class KvFacts:
    """The engine's KV cache as vLLM reports it (cache_config_info)."""

    capacity_tokens: int  # usable: one block is vLLM's null block
    bytes_per_token: int
    block_size: int


def kv_facts(metrics_text: str) -> KvFacts:
    """KV capacity and bytes per token from vLLM's cache_config_info labels."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name != "vllm:cache_config_info":
                continue
            labels = sample.labels
            try:
                blocks, block = int(labels["num_gpu_blocks"]), int(labels["block_size"])
                total_bytes = int(labels["kv_cache_memory_bytes"])
            except (KeyError, ValueError) as exc:
                raise ValueError(f"cache_config_info lacks a usable label: {exc}") from None
            return KvFacts((blocks - 1) * block, round(total_bytes / (blocks * block)), block)
    raise ValueError("no vllm:cache_config_info in /metrics")
