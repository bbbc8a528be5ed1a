"""Which queue bounds are consistent: the rule a fleet file's `queue:`, a Redis queue's settings
and the queues' own `QueueBounds` (qlm/queue/bounds.py) all check, so that a bad file is refused
where it is read, naming the field, and a queue is never built with bounds that contradict."""

from __future__ import annotations


def check_queue_bounds(
    max_queued: int | None, max_queued_per_tenant: int | None, reserved_queued: int
) -> None:
    """ValueError naming the bound when they do not fit together (None: unbounded)."""
    for name, value in (
        ("max_queued", max_queued),
        ("max_queued_per_tenant", max_queued_per_tenant),
    ):
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if reserved_queued < 0:
        raise ValueError(f"reserved_queued must be >= 0, got {reserved_queued}")
    if reserved_queued and max_queued is None:
        raise ValueError("reserved_queued needs max_queued (places are reserved out of it)")
    if max_queued is not None and reserved_queued > max_queued:
        raise ValueError(f"reserved_queued ({reserved_queued}) exceeds max_queued ({max_queued})")
