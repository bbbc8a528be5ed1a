"""Per-call deadlines from a program's end-to-end one (Parrot's objective deduction).

Question answered: by when must each call of a program give its first token and end, so
that the whole program ends by its deadline? Each call's duration is estimated alone (its
prefill, and its output at a lone request's decode step: `LoneSpeed`). The critical path is
the longest chain of durations to a result. The deadline is shared along it in proportion
to the durations: every duration is scaled by `deadline / critical path`, and a call must end
by the deadline less the scaled durations of the longest chain after it. So each hop of the
critical path gets the same share of slack (or of shortfall, under a deadline tighter than the
path), calls off it get more, and a call's first token is due its own scaled decode time
before its end. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from qlm.programs.graph import ProgramGraph


@dataclass(frozen=True, slots=True)
class CallTime:
    """A call's estimated time alone: until its first token, and until its end."""

    first_token_s: float
    completion_s: float

    @property
    def decode_s(self) -> float:
        return max(0.0, self.completion_s - self.first_token_s)


@dataclass(frozen=True, slots=True)
class CallDeadline:
    """Seconds from the program's submission."""

    ttft_s: float
    done_s: float


def critical_path_s(graph: ProgramGraph, times: Mapping[str, CallTime]) -> dict[str, float]:
    """Per call, the longest chain of durations from its start to a result (itself
    included)."""
    tail: dict[str, float] = {}
    for call in reversed(graph.calls):  # consumers come after what they use
        after = max((tail[c] for c in graph.consumers.get(call.name, ())), default=0.0)
        tail[call.name] = times[call.name].completion_s + after
    return tail


def call_deadlines(
    graph: ProgramGraph, times: Mapping[str, CallTime], deadline_s: float
) -> dict[str, CallDeadline]:
    """Each call's deadlines, the program's `deadline_s` shared along its critical path."""
    tail = critical_path_s(graph, times)
    longest = max(tail.values(), default=0.0)
    scale = deadline_s / longest if longest > 0 else 1.0
    out = {}
    for call in graph.calls:
        own = times[call.name]
        done_s = deadline_s - (tail[call.name] - own.completion_s) * scale
        out[call.name] = CallDeadline(done_s - own.decode_s * scale, done_s)
    return out
