"""How many requests may wait: an overall bound, a bound per tenant, and places of the overall
bound that only the reserved (interactive) classes may take.

One value object decides for both queue implementations: the memory queue calls `refusal`
with its counts; the Redis queue passes `class_limit` and `max_queued_per_tenant` to its
ENQUEUE script, which compares them with counts kept in Redis, atomically. Only QUEUED
requests count (in-flight work is bounded by the engines); a requeue is never refused, so an
evicted request always finds its place again, even above a bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from qlm.config.queue_limits import check_queue_bounds
from qlm.queue.queue_protocol import QueueFullError


@dataclass(frozen=True, slots=True)
class QueueBounds:
    """None means unbounded. With `max_queued` = 1000 and `reserved_queued` = 100, a batch
    request is refused once 900 requests wait; an interactive one once 1000 do."""

    max_queued: int | None = None
    max_queued_per_tenant: int | None = None
    reserved_queued: int = 0
    reserved_classes: frozenset[str] = frozenset({"interactive"})

    def __post_init__(self) -> None:
        check_queue_bounds(self.max_queued, self.max_queued_per_tenant, self.reserved_queued)

    def class_limit(self, slo_class: str) -> int | None:
        """Queued requests at most when a request of `slo_class` arrives."""
        if self.max_queued is None or slo_class in self.reserved_classes:
            return self.max_queued
        return self.max_queued - self.reserved_queued

    def refusal(
        self, slo_class: str, queued: int, tenant: str, tenant_queued: int
    ) -> QueueFullError | None:
        """Why a request of `slo_class` from `tenant` is refused given the current counts,
        or None when it fits."""
        limit = self.class_limit(slo_class)
        if limit is not None and queued >= limit:
            return self.full_error(
                slo_class, tenant, "queue" if limit == self.max_queued else "reserved"
            )
        tenant_limit = self.max_queued_per_tenant
        if tenant_limit is not None and tenant_queued >= tenant_limit:
            return self.full_error(slo_class, tenant, "tenant")
        return None

    def full_error(self, slo_class: str, tenant: str, scope: str) -> QueueFullError:
        """The error for a refusal of `scope`, with the bound in its message."""
        if scope == "tenant":
            return QueueFullError(
                f"tenant {tenant!r} has its maximum of {self.max_queued_per_tenant} queued "
                "requests",
                scope,
            )
        if scope == "reserved":
            return QueueFullError(
                f"the queue holds {self.class_limit(slo_class)} queued requests, the most class "
                f"{slo_class!r} may fill ({self.reserved_queued} places are kept for "
                f"{', '.join(sorted(self.reserved_classes))})",
                scope,
            )
        return QueueFullError(f"the queue holds its maximum of {self.max_queued} queued requests")
