"""What a batch job and an uploaded file are, as stored and as OpenAI's API shows them.

A `BatchJob` moves through OpenAI's statuses: validating (stored, its input not yet read),
in_progress (its good lines are queued requests), finalizing (every line answered; output and
error files being written), completed; or failed (the input is not JSONL at all), expired (its
deadline passed first: what finished is kept), cancelling then cancelled. Its lines become
requests with ids `<batch id>-<line number>`, so a step repeated after a crash finds them
instead of queueing them twice. Frozen values; a change is a new value (`replace`).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, replace
from typing import Any

Json = dict[str, Any]


class BatchStatus(enum.StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}


@dataclass(frozen=True, slots=True)
class StoredFile:
    """An uploaded (or QLM-written) file's metadata; its bytes are stored beside it."""

    id: str
    tenant: str
    purpose: str
    filename: str
    bytes: int
    created_at: int

    def view(self) -> Json:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }

    def to_dict(self) -> Json:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Json) -> StoredFile:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class LineError:
    """A line of the input that did not become a request, or a request that failed."""

    line: int | None  # 1-based line of the input file
    code: str
    message: str
    param: str | None = None
    custom_id: str | None = None

    def view(self) -> Json:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(frozen=True, slots=True)
class BatchJob:
    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: int
    deadline_at_s: float  # when every line must be done: the window, or metadata's tighter one
    slo_class: str
    status: BatchStatus = BatchStatus.VALIDATING
    metadata: dict[str, str] = field(default_factory=dict)
    total: int = 0  # lines in the input
    line_ids: tuple[tuple[int, str], ...] = ()  # (line, custom_id) of each queued line
    errors: tuple[LineError, ...] = ()  # lines refused at validation
    output_file_id: str | None = None
    error_file_id: str | None = None
    counts: tuple[int, int] = (0, 0)  # (completed, failed) lines, as last counted
    times: dict[str, int] = field(default_factory=dict)  # status -> when it was entered
    # When the plan says the last line ends (None: the plan does not say yet)
    estimated_done_at_s: float | None = None

    def request_id(self, line: int) -> str:
        return f"{self.id}-{line}"

    def moved(self, status: BatchStatus, now_s: float, **changes: Any) -> BatchJob:
        """This job in `status` from `now_s` on (the time of a status kept once)."""
        times = {**self.times}
        times.setdefault(status.value, int(now_s))
        return replace(self, status=status, times=times, **changes)

    def view(self) -> Json:
        """The job as OpenAI's Batch object, plus QLM's `qlm` extension."""
        completed, failed = self.counts
        at = self.times.get
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.value,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": at("in_progress"),
            "expires_at": int(self.deadline_at_s),
            "finalizing_at": at("finalizing"),
            "completed_at": at("completed"),
            "failed_at": at("failed"),
            "expired_at": at("expired"),
            "cancelling_at": at("cancelling"),
            "cancelled_at": at("cancelled"),
            "request_counts": {"total": self.total, "completed": completed, "failed": failed},
            "metadata": self.metadata or None,
            "errors": {"object": "list", "data": [e.view() for e in self.errors]}
            if self.errors
            else None,
            "qlm": {
                "slo_class": self.slo_class,
                "deadline_at": self.deadline_at_s,
                "estimated_completion_at": self.estimated_done_at_s,
            },
        }

    def to_dict(self) -> Json:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: Json) -> BatchJob:
        return cls(
            **{
                **data,
                "status": BatchStatus(data["status"]),
                "line_ids": tuple((int(n), str(c)) for n, c in data["line_ids"]),
                "errors": tuple(LineError(**e) for e in data["errors"]),
                "counts": tuple(data["counts"]),
            }
        )
