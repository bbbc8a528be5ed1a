"""Workloads: arrival statistics, trace replay of the shipped files, ramps, bursts, mixes,
per-component seeding and laziness."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from qlm.sim.traces import TraceError, load_trace
from qlm.sim.workload import (
    RateProfile,
    StreamConfig,
    component_rng,
    iter_requests,
    stream_chunks,
)
from qlm.types import DEFAULT_SLO_CLASSES, Request

DATA = Path(__file__).resolve().parents[2] / "sims" / "data"
AZURE = DATA / "azure_llm_2023_conv.csv"
MOONCAKE = DATA / "mooncake_conversation.jsonl"
CLASSES = {c.name: c for c in DEFAULT_SLO_CLASSES}
FIXED = {"source": "fixed", "prompt_tokens": 100, "output_tokens": 10}


def stream(**fields: Any) -> StreamConfig:
    data: dict[str, Any] = {
        "name": "s",
        "models": {"m": 1},
        "classes": {"interactive": 1},
        "lengths": FIXED,
    }
    data.update(fields)
    return StreamConfig.model_validate(data)


def arrivals(spec: StreamConfig, seed: int = 0) -> np.ndarray:
    return np.concatenate([c.arrival_s for c in stream_chunks(spec, seed)])


def requests(*specs: StreamConfig, seed: int = 0) -> list[Request]:
    return list(iter_requests(specs, seed, CLASSES))


# --- arrival processes -----------------------------------------------------------------------


def test_poisson_rate_and_cv() -> None:
    times = arrivals(stream(arrivals={"process": "poisson", "rate_per_s": 5.0}, count=200_000))
    gaps = np.diff(times)
    assert len(times) == 200_000
    assert 1.0 / gaps.mean() == pytest.approx(5.0, rel=0.01)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.02)
    # counts in unit windows are Poisson: variance equals the mean
    counts = np.bincount(times[times < 30_000].astype(int))
    assert counts.var() / counts.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_rate_and_cv(cv: float) -> None:
    spec = stream(arrivals={"process": "gamma", "rate_per_s": 2.0, "cv": cv}, count=200_000)
    gaps = np.diff(arrivals(spec))
    assert 1.0 / gaps.mean() == pytest.approx(2.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_duration_bounds_the_stream_and_count_wins_when_smaller() -> None:
    spec = stream(arrivals={"process": "poisson", "rate_per_s": 10.0}, duration_s=500.0)
    times = arrivals(spec)
    assert times.max() < 500.0
    assert len(times) == pytest.approx(5000, rel=0.05)
    both = stream(arrivals={"process": "poisson", "rate_per_s": 10.0}, duration_s=500, count=7)
    assert len(arrivals(both)) == 7


def test_backlog_arrives_at_the_stream_start() -> None:
    spec = stream(arrivals={"process": "backlog"}, count=1000, start_s=42.0)
    assert np.all(arrivals(spec) == 42.0)
    assert len(arrivals(spec)) == 1000


def test_a_ramp_shapes_the_rate_linearly() -> None:
    # rate 1 -> 9 over [0, 1000]: expected 1500 arrivals in the first half, 3500 in the second
    spec = stream(
        arrivals={"process": "poisson", "rate_per_s": 1.0},
        duration_s=1000.0,
        ramp={"to_rate_per_s": 9.0},
    )
    runs = [arrivals(spec, seed) for seed in range(20)]
    first = np.mean([np.sum(t < 500) for t in runs])
    second = np.mean([np.sum(t >= 500) for t in runs])
    assert first == pytest.approx(1500, rel=0.03)
    assert second == pytest.approx(3500, rel=0.03)
    deciles = np.mean([np.histogram(t, bins=10, range=(0, 1000))[0] for t in runs], axis=0)
    expected = [100 * (1 + 0.8 * k + 0.4) for k in range(10)]  # rate at each decile's middle
    assert deciles == pytest.approx(expected, rel=0.06)


def test_a_burst_multiplies_the_rate_inside_its_window() -> None:
    spec = stream(
        arrivals={"process": "gamma", "rate_per_s": 2.0, "cv": 1.5},
        duration_s=600.0,
        bursts=[{"start_s": 200.0, "duration_s": 100.0, "factor": 5.0}],
    )
    runs = [arrivals(spec, seed) for seed in range(20)]
    inside = np.mean([np.sum((t >= 200) & (t < 300)) for t in runs])
    before = np.mean([np.sum(t < 200) for t in runs])
    after = np.mean([np.sum(t >= 300) for t in runs])
    assert inside == pytest.approx(1000, rel=0.05)
    assert before == pytest.approx(400, rel=0.06)
    assert after == pytest.approx(600, rel=0.06)


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(0.1, 50),
    to_rate=st.one_of(st.just(0.0), st.floats(0.01, 50)),
    ramp=st.tuples(st.floats(0, 500), st.floats(1, 500)),
    burst=st.tuples(st.floats(0, 800), st.floats(1, 300), st.floats(0.1, 10)),
)
def test_rate_profile_inverse_undoes_cumulative(
    rate: float,
    to_rate: float,
    ramp: tuple[float, float],
    burst: tuple[float, float, float],
) -> None:
    start, length = ramp
    profile = RateProfile.build(
        rate, (start, start + length, to_rate), [(burst[0], burst[0] + burst[1], burst[2])]
    )
    ts = np.linspace(0.0, 2000.0, 97)
    ys = np.asarray([profile.cumulative(t) for t in ts])
    assert np.all(np.diff(ys) >= -1e-9)
    back = profile.inverse(ys)
    # where the rate is positive the inverse is exact; else it lands at the start of the gap
    for t, y, b in zip(ts, ys, back, strict=True):
        assert profile.cumulative(b) == pytest.approx(y, rel=1e-7, abs=1e-6)
        assert b <= t + 1e-6


def test_a_rate_that_drops_to_zero_ends_the_stream() -> None:
    spec = stream(
        arrivals={"process": "poisson", "rate_per_s": 10.0},
        count=1_000_000,
        ramp={"to_rate_per_s": 0.0, "start_s": 0.0, "end_s": 100.0},
    )
    times = arrivals(spec)
    assert times.max() <= 100.0
    assert len(times) == pytest.approx(500, rel=0.15)


# --- traces ----------------------------------------------------------------------------------


def test_azure_replay_reads_the_shipped_file() -> None:
    spec = stream(arrivals={"process": "trace", "path": str(AZURE), "format": "azure"})
    spec = spec.model_copy(update={"lengths": None})
    reqs = requests(spec)
    assert len(reqs) == 19_366
    # first rows of the file: 18:15:46.6805900 374/44, 18:15:50.9951690 396/109
    assert (reqs[0].prompt_tokens, reqs[0].max_output_tokens) == (374, 44)
    assert reqs[0].arrival_at_s == 0.0
    assert reqs[1].arrival_at_s == pytest.approx(4.3145789, abs=1e-6)
    assert (reqs[1].prompt_tokens, reqs[1].max_output_tokens) == (396, 109)
    trace = load_trace(AZURE, "azure")
    assert trace.duration_s == pytest.approx(reqs[-1].arrival_at_s)
    assert np.mean(trace.prompt_tokens) == pytest.approx(1155, rel=0.01)
    assert np.mean(trace.output_tokens) == pytest.approx(211, rel=0.01)


def test_mooncake_replay_scales_time_and_skips_an_offset() -> None:
    base = {"process": "trace", "path": str(MOONCAKE), "format": "mooncake"}
    full = requests(stream(arrivals=base, lengths={"source": "replay"}))
    assert len(full) == 12_031
    assert (full[0].prompt_tokens, full[0].max_output_tokens) == (6758, 500)
    assert full[-1].arrival_at_s == pytest.approx(3536.999)
    fast = requests(stream(arrivals={**base, "time_scale": 0.25}, lengths={"source": "replay"}))
    assert fast[-1].arrival_at_s == pytest.approx(3536.999 / 4)
    later = requests(stream(arrivals={**base, "offset_s": 1000.0}, lengths={"source": "replay"}))
    assert later[0].arrival_at_s >= 0.0
    assert later[-1].arrival_at_s == pytest.approx(2536.999)
    assert len(later) < len(full)
    # the replayed lengths follow the rows after the offset
    trace = load_trace(MOONCAKE, "mooncake")
    first = int(np.searchsorted(trace.arrival_s, 1000.0))
    assert later[0].prompt_tokens == trace.prompt_tokens[first]


def test_lengths_drawn_from_a_trace_follow_its_distribution() -> None:
    spec = stream(
        arrivals={"process": "poisson", "rate_per_s": 10.0},
        count=50_000,
        lengths={"source": "trace", "path": str(AZURE), "format": "azure"},
    )
    reqs = requests(spec)
    prompts = np.asarray([r.prompt_tokens for r in reqs])
    outputs = np.asarray([r.max_output_tokens for r in reqs])
    trace = load_trace(AZURE, "azure")
    assert prompts.mean() == pytest.approx(trace.prompt_tokens.mean(), rel=0.02)
    assert np.median(outputs) == pytest.approx(np.median(trace.output_tokens), rel=0.05)
    rows = set(zip(trace.prompt_tokens.tolist(), trace.output_tokens.tolist(), strict=True))
    assert all((r.prompt_tokens, r.max_output_tokens) in rows for r in reqs[:2000])


def test_trace_lengths_can_select_the_long_prompt_tail_and_cap_outputs() -> None:
    spec = stream(
        arrivals={"process": "backlog"},
        count=5000,
        lengths={
            "source": "trace",
            "path": str(MOONCAKE),
            "format": "mooncake",
            "min_prompt_tokens": 32_000,
            "max_output_tokens": 64,
        },
    )
    reqs = requests(spec)
    assert min(r.prompt_tokens for r in reqs) >= 32_000
    assert max(r.max_output_tokens for r in reqs) <= 64
    with pytest.raises(TraceError, match="no row"):
        requests(
            stream(
                arrivals={"process": "backlog"},
                count=1,
                lengths={"source": "trace", "path": str(AZURE), "min_prompt_tokens": 10**7},
            )
        )


def test_vidur_lengths_and_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n100,7\n300,0\n")
    trace = load_trace(path, "vidur")
    assert trace.prompt_tokens.tolist() == [100, 300]
    assert trace.output_tokens.tolist() == [7, 1]  # at least one token
    assert not trace.has_timestamps
    with pytest.raises(TraceError, match="not a azure trace"):
        load_trace(path, "azure")
    with pytest.raises(KeyError, match="known: azure, mooncake, vidur"):
        load_trace(path, "sharegpt")


# --- mixes, ids, seeding ---------------------------------------------------------------------


def test_class_and_model_mixes_follow_their_weights() -> None:
    spec = stream(
        arrivals={"process": "poisson", "rate_per_s": 1.0},
        count=40_000,
        models={"a": 1, "b": 3},
        classes={"interactive": 2, "batch-1": 1, "batch-2": 1},
    )
    reqs = requests(spec)
    share_b = np.mean([r.model == "b" for r in reqs])
    share_interactive = np.mean([r.slo_class == "interactive" for r in reqs])
    assert share_b == pytest.approx(0.75, abs=0.01)
    assert share_interactive == pytest.approx(0.5, abs=0.01)
    r = next(x for x in reqs if x.slo_class == "batch-1")
    assert r.ttft_deadline_at_s == pytest.approx(r.arrival_at_s + 60.0)


def test_streams_merge_in_arrival_order_with_unique_ids() -> None:
    a = stream(name="a", arrivals={"process": "poisson", "rate_per_s": 3.0}, count=3000)
    b = stream(name="b", arrivals={"process": "backlog"}, count=500, start_s=100.0)
    reqs = requests(a, b)
    assert len(reqs) == 3500
    assert [r.arrival_at_s for r in reqs] == sorted(r.arrival_at_s for r in reqs)
    assert len({r.id for r in reqs}) == 3500
    assert {r.id for r in reqs if r.id.startswith("b-")} == {f"b-{k}" for k in range(500)}


def test_same_seed_same_requests_and_other_seeds_differ() -> None:
    spec = stream(arrivals={"process": "gamma", "rate_per_s": 4.0, "cv": 2.0}, count=2000)
    assert requests(spec, seed=7) == requests(spec, seed=7)
    assert requests(spec, seed=7) != requests(spec, seed=8)


def test_adding_a_stream_or_changing_a_mix_does_not_shift_other_draws() -> None:
    a = stream(name="a", arrivals={"process": "poisson", "rate_per_s": 3.0}, count=1000)
    b = stream(name="b", arrivals={"process": "gamma", "rate_per_s": 1.0, "cv": 3}, count=900)
    alone = requests(a, seed=3)
    together = [r for r in requests(a, b, seed=3) if r.id.startswith("a-")]
    assert alone == together
    remixed = a.model_copy(update={"classes": {"interactive": 1, "batch-2": 1}})
    assert [r.arrival_at_s for r in requests(remixed, seed=3)] == [r.arrival_at_s for r in alone]


def test_component_generators_are_independent_and_stable() -> None:
    x = component_rng(1, "s/arrivals").random(4)
    assert np.array_equal(x, component_rng(1, "s/arrivals").random(4))
    assert not np.array_equal(x, component_rng(1, "s/lengths").random(4))
    assert not np.array_equal(x, component_rng(2, "s/arrivals").random(4))


def test_streams_are_lazy() -> None:
    huge = stream(arrivals={"process": "poisson", "rate_per_s": 1000.0}, count=100_000_000)
    first = list(itertools.islice(iter_requests([huge], 0, CLASSES), 10))
    assert [r.id for r in first] == [f"s-{k}" for k in range(10)]


def test_horizon_drops_later_arrivals() -> None:
    spec = stream(arrivals={"process": "poisson", "rate_per_s": 10.0}, count=10_000)
    kept = list(iter_requests([spec], 0, CLASSES, horizon_s=100.0))
    assert kept
    assert max(r.arrival_at_s for r in kept) < 100.0
    assert len(kept) == pytest.approx(1000, rel=0.1)


def test_rate_scale_multiplies_rates_and_compresses_traces() -> None:
    spec = stream(
        arrivals={"process": "poisson", "rate_per_s": 2.0},
        duration_s=100,
        ramp={"to_rate_per_s": 4.0},
    )
    scaled = spec.with_rate_scale(3.0)
    assert scaled.rate_profile().rate_at(0.0) == pytest.approx(6.0)
    assert scaled.rate_profile().rate_at(100.0) == pytest.approx(12.0)
    trace = stream(arrivals={"process": "trace", "path": str(AZURE)}, lengths=None)
    assert trace.with_rate_scale(2.0).arrivals.time_scale == pytest.approx(0.5)  # type: ignore[union-attr]


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"arrivals": {"process": "poisson", "rate_per_s": 1}}, "need count or duration_s"),
        ({"arrivals": {"process": "backlog"}}, "a backlog needs count"),
        (
            {"arrivals": {"process": "backlog"}, "count": 3, "ramp": {"to_rate_per_s": 2}},
            "a backlog takes no",
        ),
        (
            {
                "arrivals": {"process": "poisson", "rate_per_s": 1},
                "count": 5,
                "ramp": {"to_rate_per_s": 2},
            },
            "ramp needs end_s",
        ),
        (
            {
                "arrivals": {"process": "poisson", "rate_per_s": 1},
                "count": 5,
                "lengths": {"source": "replay"},
            },
            "needs trace arrivals",
        ),
        ({"arrivals": {"process": "gamma", "rate_per_s": 1}, "count": 5}, "cv"),
        ({"arrivals": {"process": "uniform"}, "count": 5}, "process"),
        (
            {"arrivals": {"process": "trace", "path": "/no/such/file.csv"}, "lengths": None},
            "file not found",
        ),
        (
            {"arrivals": {"process": "trace", "path": str(AZURE), "format": "sharegpt"}},
            "unknown trace format",
        ),
    ],
)
def test_invalid_streams_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        stream(**fields)


@pytest.mark.slow
def test_a_million_requests_stream_through() -> None:
    spec = stream(
        arrivals={"process": "gamma", "rate_per_s": 2000.0, "cv": 2.0},
        count=1_000_000,
        models={"a": 1, "b": 1},
        classes={"interactive": 1, "batch-2": 1},
        lengths={"source": "trace", "path": str(AZURE)},
    )
    count, last = 0, -1.0
    for request in iter_requests([spec], 0, CLASSES):
        assert request.arrival_at_s >= last
        last = request.arrival_at_s
        count += 1
    assert count == 1_000_000
    assert last == pytest.approx(500.0, rel=0.02)
