"""Requests that wait for others (a program's calls): each arrives when its inputs have ended
(plus a client's round trip, if any); its deadlines stay put (a program's call) or move with it
(a call sent by a client); a request whose input did not complete never arrives."""

from __future__ import annotations

import pytest

from qlm.sim.dependencies import Dependency, Releases
from qlm.sim.result import OutcomeState
from qlm.sim.simulate import SimConfig, simulate
from qlm.types import Fleet, Request
from tests.factories import make_instance, make_profile, make_request
from tests.sim.cases import CONFIG


def chain(n: int) -> list[Request]:
    return [make_request(id=f"c{i}", max_output_tokens=50, ttft_s=30.0) for i in range(n)]


def test_a_request_is_released_when_its_last_input_ends() -> None:
    reqs = [make_request(id=x, ttft_s=10.0) for x in ("a", "b", "m")]
    deps = {"m": Dependency(("a", "b"), delay_s=0.5, shift_deadlines=True)}
    releases = Releases(reqs, deps)
    assert [r.id for r in releases.roots()] == ["a", "b"]
    assert releases.ended("a", True, 3.0) == ([], [])
    released, failed = releases.ended("b", True, 4.0)
    assert failed == []
    (m,) = released
    assert (m.arrival_at_s, m.ttft_deadline_at_s) == (4.5, 14.5)  # the class target from 4.5


def test_a_programs_call_keeps_its_deadlines_but_is_never_due_before_it_arrives() -> None:
    reqs = [make_request(id="a"), make_request(id="b", ttft_s=2.0, completion_s=9.0)]
    releases = Releases(reqs, {"b": Dependency(("a",))})
    (b,), _ = releases.ended("a", True, 5.0)
    assert (b.arrival_at_s, b.ttft_deadline_at_s, b.completion_deadline_at_s) == (5.0, 5.0, 9.0)


def test_a_failed_input_fails_everything_downstream_once() -> None:
    reqs = [make_request(id=x) for x in ("a", "b", "c", "d")]
    deps = {"b": Dependency(("a",)), "c": Dependency(("b",)), "d": Dependency(("a", "c"))}
    releases = Releases(reqs, deps)
    assert releases.ended("a", False, 1.0) == ([], ["b", "c", "d"])
    assert releases.ended("b", False, 1.0) == ([], [])
    with pytest.raises(ValueError, match="unknown request 'x'"):
        Releases(reqs, {"b": Dependency(("x",))})
    with pytest.raises(ValueError, match="wait for each other"):
        Releases(reqs, {"b": Dependency(("c",)), "c": Dependency(("b",))})


@pytest.mark.parametrize("delay_s", [0.0, 0.25])
def test_a_simulated_chain_runs_each_step_after_the_one_before(delay_s: float) -> None:
    fleet = Fleet.of([make_instance("i0")], [make_profile("m7b")])
    requests = chain(4)
    deps = {f"c{i}": Dependency((f"c{i - 1}",), delay_s) for i in range(1, 4)}
    result = simulate(fleet, requests, "qlm", CONFIG, 0, options=SimConfig(dependencies=deps))
    outcomes = {o.request_id: o for o in result.outcomes}
    assert all(o.state is OutcomeState.COMPLETED for o in outcomes.values())
    for i in range(1, 4):
        before, after = outcomes[f"c{i - 1}"], outcomes[f"c{i}"]
        assert before.finish_s is not None
        assert after.dispatch_s is not None
        assert after.arrival_s == pytest.approx(before.finish_s + delay_s)
        assert after.dispatch_s >= after.arrival_s
