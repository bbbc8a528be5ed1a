"""What a fault test promises, counted the same way in every test: each request the plane
accepted ends exactly once from the client's point of view.

A test notes each accepted request (`accept`), then what the client finally saw: `complete`,
`fail` (a clean error the client was told about) or `duplicate` (the client received output
twice: tokens beyond what was generated, or a second final result). An accepted request with no
final outcome is lost. `FaultCounts` is the frozen result; `check()` prints it (so CI logs show
it) and asserts that nothing was lost or duplicated and that every request has one outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

# Every report checked in this test session, for the terminal summary (tests/faults/conftest.py
# prints them at the end of the run, so CI logs show the counts of passing tests too).
CHECKED: list[FaultCounts] = []


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class FaultCounts:
    """The counts of one fault test's report."""

    test: str
    accepted: int
    completed: int
    failed: int
    lost: int
    duplicated: int
    notes: tuple[str, ...] = ()

    def line(self) -> str:
        return (
            f"[fault report] {self.test}: accepted {self.accepted}, completed {self.completed}, "
            f"failed with an error {self.failed}, lost {self.lost}, duplicated {self.duplicated}"
        )


@dataclass
class FaultReport:
    """Collects, per request id, whether it was accepted and how it ended for the client."""

    test: str
    _accepted: dict[str, str] = field(default_factory=dict)  # id -> kind (stream, async, ...)
    _outcomes: dict[str, Outcome] = field(default_factory=dict)
    _errors: dict[str, str] = field(default_factory=dict)
    _duplicated: dict[str, str] = field(default_factory=dict)
    _notes: list[str] = field(default_factory=list)

    def accept(self, request_id: str, kind: str) -> None:
        if request_id in self._accepted:
            raise AssertionError(f"{request_id} accepted twice: the API reused an id")
        self._accepted[request_id] = kind

    def complete(self, request_id: str) -> None:
        self._end(request_id, Outcome.COMPLETED)

    def fail(self, request_id: str, error: str) -> None:
        self._end(request_id, Outcome.FAILED)
        self._errors[request_id] = error

    def duplicate(self, request_id: str, why: str) -> None:
        self._duplicated[request_id] = why

    def note(self, text: str) -> None:
        self._notes.append(text)

    def _end(self, request_id: str, outcome: Outcome) -> None:
        if request_id not in self._accepted:
            raise AssertionError(f"{request_id} ended but was never accepted")
        if request_id in self._outcomes:
            self.duplicate(
                request_id, f"second outcome {outcome} after {self._outcomes[request_id]}"
            )
            return
        self._outcomes[request_id] = outcome

    @property
    def accepted_ids(self) -> tuple[str, ...]:
        return tuple(self._accepted)

    def kind(self, request_id: str) -> str:
        return self._accepted[request_id]

    def counts(self) -> FaultCounts:
        ended = list(self._outcomes.values())
        return FaultCounts(
            test=self.test,
            accepted=len(self._accepted),
            completed=ended.count(Outcome.COMPLETED),
            failed=ended.count(Outcome.FAILED),
            lost=len(self.lost_ids()),
            duplicated=len(self._duplicated),
            notes=tuple(self._notes),
        )

    def lost_ids(self) -> list[str]:
        return [rid for rid in self._accepted if rid not in self._outcomes]

    def check(self, *, max_failed: int = 0) -> FaultCounts:
        """Print the report, then assert: nothing lost, nothing duplicated, at most
        `max_failed` clean failures."""
        counts = self.counts()
        CHECKED.append(counts)
        print(counts.line())
        for note in counts.notes:
            print(f"[fault report] {self.test}: {note}")
        for rid, error in self._errors.items():
            print(f"[fault report] {self.test}: {rid} failed: {error[:200]}")
        assert counts.lost == 0, f"lost: {self.lost_ids()[:10]}"
        assert counts.duplicated == 0, f"duplicated: {dict(list(self._duplicated.items())[:10])}"
        assert counts.completed + counts.failed == counts.accepted
        assert counts.failed <= max_failed, f"failed: {dict(list(self._errors.items())[:10])}"
        return counts
