"""benchmarks/density_live: the traffic turns its popularity at the shift, the client-side
attainment counts a late or missing first token as a miss, the plane's configuration is one
`qlm serve` accepts (the cold variant without a standby tier or wake_s), and the swap counts
come from the plane's Prometheus text."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from benchmarks.density_live.plane import Variant, serve_config, swap_counts
from benchmarks.density_live.workload import Arrival, Seen, arrivals, per_model, summarise
from qlm.config.serve_config import ServeConfig
from qlm.config.vllm_config import VllmEngineConfig

MODELS = ["m1", "m2", "m3", "m4"]


def test_popularity_turns_at_the_shift() -> None:
    planned = arrivals(MODELS, rate_per_s=40.0, duration_s=200.0, seed=1, shift_at_s=100.0)
    early = Counter(a.model for a in planned if a.at_s < 100.0)
    late = Counter(a.model for a in planned if a.at_s >= 100.0)
    assert early.most_common(1)[0][0] == "m1"
    assert late.most_common(1)[0][0] == "m3"  # turned by half the models
    assert early["m4"] < early["m1"] / 2
    assert late["m2"] < late["m3"] / 2
    assert all(a.at_s < 200.0 for a in planned)
    share = sum(a.slo_class == "interactive" for a in planned) / len(planned)
    assert 0.65 < share < 0.75
    assert arrivals(MODELS, 40.0, 200.0, seed=1, shift_at_s=100.0) == planned  # seeded


def test_a_late_or_missing_first_token_misses() -> None:
    def seen(model: str, slo_class: str, ttft_s: float | None) -> Seen:
        return Seen(Arrival(0.0, model, slo_class, 0), ttft_s)

    got = [
        seen("m1", "interactive", 1.0),
        seen("m1", "interactive", 12.0),  # late
        seen("m2", "interactive", None),  # never answered
        seen("m2", "batch", 250.0),
    ]
    summary = summarise(got, {"interactive": 10.0, "batch": 300.0})
    assert summary["failed"] == 1
    assert summary["interactive"]["met"] == 1
    assert summary["interactive"]["attainment"] == 1 / 3
    assert summary["batch"]["attainment"] == 1.0
    assert per_model(got, "interactive", 10.0) == {"m1": "1/2", "m2": "0/1"}


def _profile() -> dict[str, object]:
    return {
        "model": "m1",
        "gpu_type": "cpu",
        "weight_bytes": 1_000_000,
        "kv_bytes_per_token": 1024,
        "decode_table": {"batch_sizes": [1, 4], "step_s": [0.008, 0.012]},
        "prefill_tokens_per_s": 20_000,
        "output_tokens_mean": 32,
        "output_tokens_std": 1,
        "load_s": 40.0,
        "wake_s": 0.05,
        "max_batch_size": 4,
        "provenance": {"summary": "measured"},
    }


def test_the_plane_config_validates_with_and_without_a_tier(tmp_path: Path) -> None:
    models = {m: tmp_path / m for m in MODELS}
    ttft = {"interactive": 10.0, "batch": 300.0}
    python = tmp_path / "python"
    tiered = ServeConfig.model_validate(
        serve_config(Variant("standby", 2), models, _profile(), "redis://x:1", python, ttft)
    )
    cold = ServeConfig.model_validate(
        serve_config(Variant("cold", 0), models, _profile(), "redis://x:1", python, ttft)
    )
    assert [i.id for i in tiered.instance_list()] == ["cpu-0", "cpu-1"]
    assert {p.model for p in tiered.fleet_config.profiles} == set(MODELS)
    assert all(p.wake_s == 0.05 for p in tiered.fleet_config.profiles)
    assert all(p.wake_s is None for p in cold.fleet_config.profiles)
    assert VllmEngineConfig.model_validate(tiered.engine.vllm).standby_models == 2
    assert VllmEngineConfig.model_validate(cold.engine.vllm).standby_models == 0


def test_swap_counts_from_the_prometheus_text() -> None:
    registry = CollectorRegistry()
    seconds = Histogram(
        "qlm_model_swap_seconds", "", ("model_name",), buckets=(1.0, 5.0, 60.0), registry=registry
    )
    for value in (0.1, 0.2, 40.0):
        seconds.labels("m1").observe(value)
    got = swap_counts(generate_latest(registry).decode())
    assert got["done"] == 3
    assert got["fast"] == 2  # within 5 s: the wakes
    assert abs(got["seconds"] - 40.3) < 1e-9
