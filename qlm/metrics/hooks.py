"""What the API, the agents and the control loop call when something worth counting happens
(`MetricsHooks`), and the recorder of a process that exports nothing (`NO_METRICS`: tests and
the simulator pay nothing). The Prometheus implementation is `PlaneMetrics` (recorder.py); the
callers know only this protocol, so the live plane's code does not depend on how metrics are
kept. `met_slo` is the one definition of a kept promise the live plane counts (the simulator's,
qlm/sim/result.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from qlm.control.plan import PublishedPlan
from qlm.queue.records import InstanceStatus, RequestResult
from qlm.solver.plan_types import Plan
from qlm.types import Request, RequestState


def met_slo(request: Request, result: RequestResult) -> bool:
    """Completed, first token by the TTFT deadline, and finished by the completion deadline if
    the request has one (the simulator's definition, qlm/sim/result.py)."""
    if result.state is not RequestState.COMPLETED or result.first_token_at_s is None:
        return False
    if result.first_token_at_s > request.ttft_deadline_at_s:
        return False
    deadline = request.completion_deadline_at_s
    return deadline is None or (
        result.finished_at_s is not None and result.finished_at_s <= deadline
    )


@dataclass(frozen=True, slots=True)
class PlaneEvent:
    """A swap or an eviction, for the dashboard's recent-events list."""

    at_s: float
    kind: str  # "swap", "swapped" (the new model serves) or "eviction"
    instance_id: str
    detail: str


class MetricsHooks(Protocol):
    """What the API, agents and control loop call. PlaneMetrics records; NO_METRICS ignores."""

    def request_admitted(self, request: Request) -> None: ...

    def request_rejected(self, model: str, slo_class: str | None, reason: str) -> None: ...

    def request_cancelled(self, request: Request) -> None: ...

    def request_finished(self, request: Request, result: RequestResult) -> None: ...

    def evicted(self, instance_id: str, requests: Iterable[Request], kind: str = "abort") -> None:
        """`kind`: abort (aborted and requeued) or kv_swap (KV moved to CPU memory)."""
        ...

    def model_swap_started(
        self, instance_id: str, model: str, from_model: str | None = None
    ) -> None: ...

    def model_loaded(self, instance_id: str, model: str, load_s: float) -> None: ...

    def instance_status(self, status: InstanceStatus) -> None: ...

    def leadership(self, leading: bool) -> None: ...

    def queue_snapshot(self, queued: Sequence[Request], plan: PublishedPlan | None) -> None: ...

    def planned(
        self, solve: Plan | None, plan: PublishedPlan, queued: Sequence[Request], now_s: float
    ) -> None: ...

    def plan_failed(self) -> None: ...


class _NoMetrics:
    """The recorder of a process that exports nothing."""

    def request_admitted(self, request: Request) -> None:
        pass

    def request_rejected(self, model: str, slo_class: str | None, reason: str) -> None:
        pass

    def request_cancelled(self, request: Request) -> None:
        pass

    def request_finished(self, request: Request, result: RequestResult) -> None:
        pass

    def evicted(self, instance_id: str, requests: Iterable[Request], kind: str = "abort") -> None:
        pass

    def model_swap_started(
        self, instance_id: str, model: str, from_model: str | None = None
    ) -> None:
        pass

    def model_loaded(self, instance_id: str, model: str, load_s: float) -> None:
        pass

    def instance_status(self, status: InstanceStatus) -> None:
        pass

    def leadership(self, leading: bool) -> None:
        pass

    def queue_snapshot(self, queued: Sequence[Request], plan: PublishedPlan | None) -> None:
        pass

    def planned(
        self, solve: Plan | None, plan: PublishedPlan, queued: Sequence[Request], now_s: float
    ) -> None:
        pass

    def plan_failed(self) -> None:
        pass


NO_METRICS: MetricsHooks = _NoMetrics()
