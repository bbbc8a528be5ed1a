"""Exact-key grouping, the baseline: one group per (model, SLO class), cut by size."""

from __future__ import annotations

from collections.abc import Sequence

from qlm.grouping.group import RequestGroup
from qlm.grouping.grouping_base import GROUPING_POLICIES
from qlm.grouping.partition import PartitionedGrouping, RequestColumns, split_planned
from qlm.types import Request


@GROUPING_POLICIES.register("exact-key")
class ExactKeyGrouping(PartitionedGrouping):
    """One group per (model, SLO class), each cut by ttft deadline to at most max_group_size.
    `needs_regroup` after recluster_every_inserts inserts: a rebalance re-cuts the parts that
    inserts and removals left uneven."""

    def regroup(self, requests: Sequence[Request], now_s: float) -> tuple[RequestGroup, ...]:
        rest, planned = split_planned(requests)
        columns = RequestColumns.of(rest)
        order = columns.order(columns.model_codes, columns.slo_codes)
        return self._load(rest, columns, order, columns.slo_class_runs(order), planned)

    def add(self, request: Request) -> str:
        return self._add(request, (request.model, request.slo_class))
