"""The dashboard's table of recent late requests: each ended request that missed its SLO, with
its cause (qlm/causes/live.py), how late it was, and the wait the API predicted for it at
admission beside the one it got. Pure: records in, JSON-ready rows out."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from qlm.causes.live import result_cause
from qlm.queue.records import RequestRecord

Json = dict[str, Any]


def late_rows(records: Iterable[RequestRecord]) -> list[Json]:
    """One row per ended record that missed its SLO, in the order given."""
    rows: list[Json] = []
    for record in records:
        result = record.result
        if result is None:
            continue
        request = record.request
        cause = result_cause(request, result)
        if cause is None:
            continue
        first_s = result.first_token_at_s
        ttft_s = None if first_s is None else first_s - request.arrival_at_s
        rows.append(
            {
                "id": request.id,
                "slo_class": request.slo_class,
                "model": request.model,
                "instance_id": result.instance_id,
                "state": str(result.state),
                "cause": str(cause),
                "ttft_s": ttft_s,
                "ttft_target_s": request.ttft_slo_s,
                "late_by_s": None if first_s is None else first_s - request.ttft_deadline_at_s,
                "estimated_wait_s": request.estimated_wait_s,
                "estimate_basis": request.estimate_basis or None,
                "finished_at_s": result.finished_at_s,
            }
        )
    return rows
