"""Why a simulated request missed its SLO: the shared classifier (qlm/causes/classify.py, whose
docstring lists the causes and their precedence) over what the runner recorded for it (its
RequestOutcome and the time the run ended), never a policy's internals, so equal facts give the
same cause under every policy."""

from __future__ import annotations

from collections.abc import Iterable

from qlm.causes import MissCause, MissFacts, classify_miss
from qlm.sim.result import OutcomeState, RequestOutcome

__all__ = ["MissCause", "miss_cause", "miss_cause_counts", "outcome_facts"]


def miss_cause(outcome: RequestOutcome, run_end_s: float) -> MissCause | None:
    """Why the request missed its SLO (qlm/causes/classify.py); None when it met it."""
    return classify_miss(outcome_facts(outcome), run_end_s)


def outcome_facts(outcome: RequestOutcome) -> MissFacts:
    """The classifier's facts of a simulated request."""
    return MissFacts(
        arrival_s=outcome.arrival_s,
        ttft_deadline_s=outcome.ttft_deadline_s,
        completion_deadline_s=outcome.completion_deadline_s,
        first_token_s=outcome.first_token_s,
        finished_s=outcome.finish_s,
        failed=outcome.state is OutcomeState.FAILED,
        unfinished=outcome.state is OutcomeState.UNFINISHED,
        interrupted_s=outcome.interrupted_s,
        queue_wait_s=outcome.queue_wait_s,
        no_model_wait_s=outcome.no_model_wait_s,
        load_wait_s=outcome.load_wait_s,
    )


def miss_cause_counts(outcomes: Iterable[RequestOutcome], run_end_s: float) -> dict[str, int]:
    """Missed requests per cause, every cause in precedence order (zeros included)."""
    counts = dict.fromkeys((str(c) for c in MissCause), 0)
    for outcome in outcomes:
        cause = miss_cause(outcome, run_end_s)
        if cause is not None:
            counts[cause] += 1
    return counts
