"""Program graphs: what is refused (naming the call and the variable), the order calls run in,
and rendering."""

from __future__ import annotations

import random

import pytest

from qlm.programs.graph import ProgramCall, ProgramError, ProgramGraph, ProgramLimits, render


def call(name: str, prompt: str) -> ProgramCall:
    return ProgramCall(name, "m7b", prompt, 16)


def test_map_reduce_runs_the_maps_first_and_the_merge_once_they_are_done() -> None:
    maps = tuple(call(f"s{i}", f"Summarise: {{{{c{i}}}}}") for i in range(3))
    merge = call("merged", "Merge: {{s0}} / {{s1}} / {{s2}}")
    graph = ProgramGraph.of((merge, *maps), ("c0", "c1", "c2"))
    assert [c.name for c in graph.calls] == ["s0", "s1", "s2", "merged"]
    assert [c.name for c in graph.ready(set())] == ["s0", "s1", "s2"]
    assert [c.name for c in graph.ready({"s0", "s1"})] == ["s2"]
    assert [c.name for c in graph.ready({"s0", "s1", "s2"})] == ["merged"]
    assert graph.sinks() == ("merged",)
    assert graph.consumers["s1"] == ("merged",)
    assert merge.head == "Merge: "


@pytest.mark.parametrize(
    ("calls", "inputs", "message", "param"),
    [
        ((call("a", "x {{nope}}"),), (), "call 'a' uses variable 'nope'", "calls[0].prompt"),
        ((call("a", "{{b}}"), call("b", "{{a}}")), (), "calls a -> b -> a form a cycle",
         "calls[0].prompt"),
        ((call("a", "x"), call("a", "y")), (), "'a' names two variables", "calls[1].name"),
        ((call("a", "x"),), ("a",), "'a' names two variables", "calls[0].name"),
        ((call("a.b", "x"),), (), "call name 'a.b' is not a valid", "calls[0].name"),
        ((), ("x",), "input 'x' is used by no call", "inputs"),
        ((call("a", "{{a}}"),), (), "calls a -> a form a cycle", "calls[0].prompt"),
    ],
)  # fmt: skip
def test_a_malformed_program_is_refused_naming_the_call_and_the_variable(
    calls: tuple[ProgramCall, ...], inputs: tuple[str, ...], message: str, param: str
) -> None:
    with pytest.raises(ProgramError) as caught:
        ProgramGraph.of(calls, inputs)
    assert message in caught.value.message
    assert caught.value.param == param


def test_limits_on_calls_fan_in_and_fan_out() -> None:
    limits = ProgramLimits(max_calls=2, max_references=2, max_consumers=2)
    with pytest.raises(ProgramError, match="at most 2"):
        ProgramGraph.of(tuple(call(f"c{i}", "x") for i in range(3)), (), limits)
    with pytest.raises(ProgramError, match="uses 3 variables; at most 2"):
        ProgramGraph.of((call("m", "{{a}}{{b}}{{c}}"),), ("a", "b", "c"), limits)
    with pytest.raises(ProgramError, match="variable 'a' feeds 3 calls"):
        ProgramGraph.of(
            tuple(call(f"c{i}", "{{a}}") for i in range(3)),
            ("a",),
            limits.__class__(max_calls=9, max_references=2, max_consumers=2),
        )


def test_random_dags_come_out_in_an_order_where_each_call_follows_what_it_uses() -> None:
    rng = random.Random(7)
    for _ in range(50):
        n = rng.randint(1, 30)
        calls = []
        for i in range(n):
            uses = rng.sample(range(i), k=min(i, rng.randint(0, 3)))
            calls.append(call(f"c{i}", "go " + " ".join(f"{{{{c{j}}}}}" for j in uses)))
        rng.shuffle(calls)
        graph = ProgramGraph.of(tuple(calls), ())
        placed: set[str] = set()
        for c in graph.calls:
            assert set(c.references) <= placed
            placed.add(c.name)
        assert len(placed) == n


def test_render_fills_every_placeholder_once_per_use() -> None:
    assert render("{{a}} and {{ b }} and {{a}}", {"a": "x", "b": "y"}) == "x and y and x"
    assert call("c", "{{a}} {{b}} {{a}}").references == ("a", "b")


def test_a_long_chain_in_reverse_order_is_ordered_without_deep_recursion() -> None:
    n = 3_000
    calls = tuple(call(f"c{i}", f"go {{{{c{i + 1}}}}}" if i + 1 < n else "start") for i in range(n))
    graph = ProgramGraph.of(calls, (), ProgramLimits(max_calls=n))
    assert [c.name for c in graph.calls] == [f"c{i}" for i in reversed(range(n))]


def test_an_input_no_call_uses_is_refused() -> None:
    with pytest.raises(ProgramError, match="input 'spare' is used by no call"):
        ProgramGraph.of((call("a", "{{doc}}"),), ("doc", "spare"))


def test_a_program_of_no_calls_is_a_session_for_contexts() -> None:
    assert ProgramGraph.of((), ()).calls == ()
