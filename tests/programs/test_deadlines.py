"""Per-call deadlines from a program's end-to-end one, shared along its critical path."""

from __future__ import annotations

import random

import pytest

from qlm.programs.deadlines import CallTime, call_deadlines, critical_path_s
from qlm.programs.graph import ProgramCall, ProgramGraph


def graph(*edges: tuple[str, str], names: tuple[str, ...]) -> ProgramGraph:
    uses: dict[str, list[str]] = {n: [] for n in names}
    for before, after in edges:
        uses[after].append(before)
    calls = tuple(
        ProgramCall(n, "m", "go " + " ".join("{{" + u + "}}" for u in uses[n]), 8) for n in names
    )
    return ProgramGraph.of(calls, ())


def test_a_chain_shares_the_deadline_in_proportion_to_each_calls_time() -> None:
    chain = graph(("a", "b"), ("b", "c"), names=("a", "b", "c"))
    times = {"a": CallTime(1.0, 2.0), "b": CallTime(1.0, 4.0), "c": CallTime(0.5, 2.0)}
    out = call_deadlines(chain, times, deadline_s=16.0)  # the path takes 8 s: scale 2
    assert out["c"].done_s == pytest.approx(16.0)
    assert out["b"].done_s == pytest.approx(12.0)
    assert out["a"].done_s == pytest.approx(4.0)
    assert out["a"].ttft_s == pytest.approx(4.0 - 2 * 1.0)  # its decode, scaled, before its end
    assert out["c"].ttft_s == pytest.approx(16.0 - 2 * 1.5)


def test_a_deadline_tighter_than_the_path_compresses_every_share_alike() -> None:
    chain = graph(("a", "b"), names=("a", "b"))
    times = {"a": CallTime(0.0, 3.0), "b": CallTime(0.0, 1.0)}
    out = call_deadlines(chain, times, deadline_s=2.0)  # the path takes 4 s: scale 0.5
    assert (out["a"].done_s, out["b"].done_s) == pytest.approx((1.5, 2.0))


def test_calls_off_the_critical_path_get_more_slack() -> None:
    # a -> c and b -> c; a takes 5 s, b 1 s: b may end as late as a
    dag = graph(("a", "c"), ("b", "c"), names=("a", "b", "c"))
    times = {"a": CallTime(0.0, 5.0), "b": CallTime(0.0, 1.0), "c": CallTime(0.0, 1.0)}
    out = call_deadlines(dag, times, deadline_s=12.0)  # path 6 s: scale 2
    assert out["a"].done_s == pytest.approx(out["b"].done_s) == pytest.approx(10.0)
    assert out["a"].done_s - 2 * 5.0 == pytest.approx(0.0)  # a has no slack left
    assert out["b"].done_s - 2 * 1.0 > 0.0  # b has 8 s of slack


def test_on_random_dags_each_call_fits_between_its_inputs_and_its_consumers() -> None:
    rng = random.Random(3)
    for _ in range(40):
        n = rng.randint(1, 20)
        names = tuple(f"c{i}" for i in range(n))
        edges = [(f"c{j}", f"c{i}") for i in range(n) for j in range(i) if rng.random() < 0.2]
        dag = graph(*edges, names=names)
        times = {c: CallTime(t := rng.uniform(0.1, 2), t + rng.uniform(0, 5)) for c in names}
        deadline_s = rng.uniform(1, 60)
        out = call_deadlines(dag, times, deadline_s)
        scale = deadline_s / max(critical_path_s(dag, times).values())
        for before, after in edges:  # a consumer's window holds its own scaled time
            window_s = out[after].done_s - out[before].done_s
            assert window_s >= times[after].completion_s * scale - 1e-9
        for c in dag.sinks():
            assert out[c].done_s == pytest.approx(deadline_s)
        assert min(out[c].done_s - times[c].completion_s * scale for c in names) >= -1e-9
