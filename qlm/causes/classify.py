"""Why a request missed its SLO: one cause per missed request, classified from plain facts about
it (`MissFacts`), shared by the simulator (qlm/sim/miss_causes.py, from what its runner
recorded) and the live plane (qlm/causes/live.py, from what the agent that ended it knew).
Pure: no clock, no policy internals, so equal facts give the same cause in both planes.

The causes, in precedence order (the first that applies wins):

    failed       an engine dropped it on its own (state `failed`)
    unfinished   the run ended before its SLO was decided: it had no first token and the run
                 ended before its TTFT deadline, or its first token was on time and the run
                 ended before its completion deadline (or it has none)
    evicted      an engine let it go (an eviction by the policy, or an abort by the engine)
                 before its first token, or at any time when its first token was on time

Then, when its first token came late or never came: the largest of four shares of its time from
arrival to its first token (to the end of the run when it got none); at equal shares the
earlier one here wins:

    no_instance  in the global queue while no instance had its model loaded or loading (a
                 model no GPU type of the fleet can hold never is)
    model_load   in the global queue while an instance was loading its model and none had it
                 loaded
    queued       in the global queue while some instance had its model loaded
    in_engine    held by an engine before its first token (waiting for a batch slot, prefill)

Else (first token on time, finished after its completion deadline or not at all):

    slow_decode  decoding took too long
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class MissCause(StrEnum):
    FAILED = "failed"
    UNFINISHED = "unfinished"
    EVICTED = "evicted"
    NO_INSTANCE = "no_instance"
    MODEL_LOAD = "model_load"
    QUEUED = "queued"
    IN_ENGINE = "in_engine"
    SLOW_DECODE = "slow_decode"


@dataclass(frozen=True, slots=True)
class MissFacts:
    """What is known of one request, all times on one clock (seconds).

    failed: an engine dropped it; unfinished: it had not ended when the facts were taken (the
    simulator's run end). queue_wait_s: its time in the global queue before its first token
    (before the end, without one); no_model_wait_s and load_wait_s: the parts of that wait while
    no instance had its model loaded or loading, and while an instance was loading it and none
    had it loaded. interrupted_s: when an engine first let it go (eviction or abort), if ever.
    """

    arrival_s: float
    ttft_deadline_s: float
    completion_deadline_s: float | None
    first_token_s: float | None
    finished_s: float | None
    failed: bool = False
    unfinished: bool = False
    interrupted_s: float | None = None
    queue_wait_s: float = 0.0
    no_model_wait_s: float = 0.0
    load_wait_s: float = 0.0

    @property
    def met_slo(self) -> bool:
        """Completed, first token by its TTFT deadline, and done by its completion deadline if
        it has one."""
        if self.failed or self.unfinished or self.first_token_s is None:
            return False
        if self.first_token_s > self.ttft_deadline_s:
            return False
        deadline = self.completion_deadline_s
        return deadline is None or (self.finished_s is not None and self.finished_s <= deadline)


def classify_miss(facts: MissFacts, end_s: float) -> MissCause | None:
    """Why the request missed its SLO (module docstring); None when it met it. `end_s`: when
    the facts were taken (the run's end in the simulator); it bounds the shares of a request
    that never got a first token."""
    if facts.met_slo:
        return None
    if facts.failed:
        return MissCause.FAILED
    first_s = facts.first_token_s
    on_time = first_s is not None and first_s <= facts.ttft_deadline_s
    if facts.unfinished and _undecided(facts, on_time, end_s):
        return MissCause.UNFINISHED
    interrupted_s = facts.interrupted_s
    if interrupted_s is not None and (on_time or first_s is None or interrupted_s < first_s):
        return MissCause.EVICTED
    if on_time:
        return MissCause.SLOW_DECODE
    return _slowest_share(facts, end_s if first_s is None else first_s)


def _undecided(facts: MissFacts, on_time: bool, end_s: float) -> bool:
    """The run ended before the request could miss (it is unfinished)."""
    if facts.first_token_s is None:
        return end_s < facts.ttft_deadline_s
    deadline_s = facts.completion_deadline_s
    return on_time and (deadline_s is None or end_s < deadline_s)


def _slowest_share(facts: MissFacts, until_s: float) -> MissCause:
    """The largest share of the time from arrival to until_s (ties: the first listed)."""
    waited_s = facts.queue_wait_s
    shares = (
        (facts.no_model_wait_s, MissCause.NO_INSTANCE),
        (facts.load_wait_s, MissCause.MODEL_LOAD),
        (waited_s - facts.no_model_wait_s - facts.load_wait_s, MissCause.QUEUED),
        (until_s - facts.arrival_s - waited_s, MissCause.IN_ENGINE),
    )
    best_s, cause = shares[0]
    for share_s, candidate in shares[1:]:
        if share_s > best_s:
            best_s, cause = share_s, candidate
    return cause
