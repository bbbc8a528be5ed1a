"""What every grouping policy shares: `RequestColumns` (requests as numpy columns, for
vectorised regrouping), `KeyedPartition` (requests kept by id, groups keyed by (model, tag),
the split rule, cached summaries), `halving_sizes` (the split rule itself) and
`PartitionedGrouping` (the Protocol's bookkeeping). A policy decides only which key a request
belongs to.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
from numpy.typing import NDArray

from qlm.config import GroupingConfig
from qlm.grouping.group import RequestGroup
from qlm.types import Request

GroupKey = tuple[str, str]  # (model, tag); the key's groups are named f"{model}/{tag}.{part}"
KeyRun = tuple[GroupKey, int]  # a key and how many consecutive ordered rows belong to it


def halving_sizes(num_requests: int, max_group_size: int) -> list[int]:
    """The split rule: cut in half (the first half takes the odd one) until no part exceeds
    max_group_size. Sizes are in order; e.g. 300 with a maximum of 128 gives [75, 75, 75, 75]."""
    if num_requests <= max_group_size:
        return [num_requests]
    first = (num_requests + 1) // 2
    return halving_sizes(first, max_group_size) + halving_sizes(
        num_requests - first, max_group_size
    )


def group_id(key: GroupKey, part: int) -> str:
    return f"{key[0]}/{key[1]}.{part}"


def job_key(request: Request) -> GroupKey | None:
    """A planned batch job's part is its own key (qlm/prefixes/job_plan.py: the job's plan
    already grouped it by shared prefix and sized it to an engine batch); None otherwise."""
    return None if request.job_group is None else (request.model, f"job:{request.job_group}")


def split_planned(requests: Sequence[Request]) -> tuple[list[Request], list[Request]]:
    """(requests the policy groups, requests of planned jobs, which keep their parts)."""
    rest: list[Request] = []
    planned: list[Request] = []
    for request in requests:
        (rest if request.job_group is None else planned).append(request)
    return rest, planned


def deadline_order(request: Request) -> tuple[float, float, str]:
    """The order requests are split in: ttft deadline, then arrival, then id."""
    return (request.ttft_deadline_at_s, request.arrival_at_s, request.id)


@dataclass(frozen=True, slots=True)
class RequestColumns:
    """The fields grouping reads, one numpy array per field, rows in input order. Strings are
    coded by their rank among the sorted distinct values, so codes sort like names."""

    ids: list[str]
    id_keys: NDArray[np.str_]  # ids for sorting (numpy strings drop trailing NULs)
    model_codes: NDArray[np.intp]
    models: tuple[str, ...]  # code -> name
    slo_codes: NDArray[np.intp]
    slo_classes: tuple[str, ...]  # code -> name
    prompt_tokens: NDArray[np.int64]
    max_output_tokens: NDArray[np.int64]
    arrival_at_s: NDArray[np.float64]
    ttft_deadline_at_s: NDArray[np.float64]
    completion_deadline_at_s: NDArray[np.float64]  # NaN where the request has none

    @classmethod
    def of(cls, requests: Sequence[Request]) -> RequestColumns:
        ids = _values(requests, "id")
        model_codes, models = _encode(_values(requests, "model"))
        slo_codes, slo_classes = _encode(_values(requests, "slo_class"))
        return cls(
            ids=ids,
            id_keys=np.array(ids, dtype=np.str_),
            model_codes=model_codes,
            models=models,
            slo_codes=slo_codes,
            slo_classes=slo_classes,
            prompt_tokens=np.array(_values(requests, "prompt_tokens"), dtype=np.int64),
            max_output_tokens=np.array(_values(requests, "max_output_tokens"), dtype=np.int64),
            arrival_at_s=np.array(_values(requests, "arrival_at_s"), dtype=np.float64),
            ttft_deadline_at_s=np.array(_values(requests, "ttft_deadline_at_s"), dtype=np.float64),
            completion_deadline_at_s=np.array(
                _values(requests, "completion_deadline_at_s"), dtype=np.float64
            ),
        )

    def order(self, *primary: NDArray[np.intp]) -> NDArray[np.intp]:
        """Row order by the primary keys (most significant first), then `deadline_order`."""
        keys = (self.id_keys, self.arrival_at_s, self.ttft_deadline_at_s, *reversed(primary))
        order: NDArray[np.intp] = np.lexsort(keys)
        return order

    def slo_class_runs(self, order: NDArray[np.intp]) -> list[KeyRun]:
        """The (model, slo class) runs of rows ordered by model, then slo class."""
        num_classes = len(self.slo_classes)
        cells = self.model_codes[order] * num_classes + self.slo_codes[order]
        counts = np.bincount(cells, minlength=len(self.models) * num_classes).tolist()
        return [
            ((self.models[cell // num_classes], self.slo_classes[cell % num_classes]), count)
            for cell, count in enumerate(counts)
            if count
        ]


def _values(requests: Sequence[Request], field: str) -> list[Any]:
    return list(map(attrgetter(field), requests))


def _encode(values: list[str]) -> tuple[NDArray[np.intp], tuple[str, ...]]:
    """Codes that sort like the names (fast for few distinct values: one dict lookup each)."""
    names = sorted(set(values))
    code_of = {name: code for code, name in enumerate(names)}
    codes = np.fromiter(map(code_of.__getitem__, values), dtype=np.intp, count=len(values))
    return codes, tuple(names)


@dataclass(frozen=True, slots=True)
class _Slices:
    """Consecutive slices of the ordered rows, one per group to be built."""

    group_ids: list[str]
    keys: list[GroupKey]
    starts: NDArray[np.intp]
    sizes: NDArray[np.intp]

    @classmethod
    def cut(cls, runs: Sequence[KeyRun], max_group_size: int) -> _Slices:
        group_ids: list[str] = []
        keys: list[GroupKey] = []
        sizes: list[int] = []
        for key, count in runs:
            parts = halving_sizes(count, max_group_size) if count else []
            group_ids += [group_id(key, part) for part in range(len(parts))]
            keys += [key] * len(parts)
            sizes += parts
        size_array = np.array(sizes, dtype=np.intp)
        return cls(group_ids, keys, np.cumsum(size_array) - size_array, size_array)


def summarise_slices(
    columns: RequestColumns, order: NDArray[np.intp], slices: _Slices
) -> list[RequestGroup]:
    """Group summaries computed with numpy over each slice of the ordered rows. Equal to
    `RequestGroup.of` on the same members in the same order, provided each slice is in
    ttft-deadline order (the SLO-class tie-break relies on it)."""
    if not len(slices.starts):
        return []
    starts = slices.starts
    ids = [columns.ids[row] for row in order.tolist()]
    prompt_sums = np.add.reduceat(columns.prompt_tokens[order], starts).tolist()
    output_sums = np.add.reduceat(columns.max_output_tokens[order], starts).tolist()
    ttft = np.minimum.reduceat(columns.ttft_deadline_at_s[order], starts).tolist()
    completion = np.fmin.reduceat(columns.completion_deadline_at_s[order], starts).tolist()
    arrival = np.minimum.reduceat(columns.arrival_at_s[order], starts).tolist()
    slo = _dominant_classes(columns.slo_codes[order], slices, len(columns.slo_classes))
    models = columns.model_codes[order][starts].tolist()
    return [
        RequestGroup(
            id=id_,
            model=columns.models[models[g]],
            slo_class=columns.slo_classes[slo[g]],
            request_ids=tuple(ids[start : start + size]),
            prompt_tokens_mean=prompt_sums[g] / size,
            output_cap_mean=output_sums[g] / size,
            ttft_deadline_at_s=ttft[g],
            completion_deadline_at_s=None if math.isnan(completion[g]) else completion[g],
            first_arrival_at_s=arrival[g],
        )
        for g, (id_, start, size) in enumerate(
            zip(slices.group_ids, starts.tolist(), slices.sizes.tolist(), strict=True)
        )
    ]


def _dominant_classes(slo_codes: NDArray[np.intp], slices: _Slices, num_classes: int) -> list[int]:
    """Per slice, the most common class; ties go to the class seen first (in deadline order,
    the one with the earliest deadline), as `RequestGroup.of` decides."""
    num_groups = len(slices.starts)
    num_rows = len(slo_codes)
    cells = np.repeat(np.arange(num_groups), slices.sizes) * num_classes + slo_codes
    counts = np.bincount(cells, minlength=num_groups * num_classes).reshape(num_groups, -1)
    first = np.full(num_groups * num_classes, num_rows, dtype=np.intp)
    np.minimum.at(first, cells, np.arange(num_rows))
    most = counts == counts.max(axis=1, keepdims=True)
    winners: list[int] = (
        np.where(most, first.reshape(num_groups, -1), num_rows).argmin(axis=1).tolist()
    )
    return winners


@dataclass(slots=True, eq=False)
class _Group:
    """One live group (mutable, internal). `floor_s` is a lower bound on the members' ttft
    deadlines that routes inserts to the right part; `summary` is None when stale."""

    id: str
    key: GroupKey
    members: dict[str, None]  # request ids, an ordered set
    floor_s: float
    summary: RequestGroup | None = None


class KeyedPartition:
    """Requests partitioned into groups by key. A key's groups ("parts") are consecutive
    ttft-deadline ranges, none larger than max_group_size. Summaries are cached per group and
    rebuilt only for groups that changed."""

    def __init__(self, max_group_size: int) -> None:
        self.max_group_size = max_group_size
        self._clear()

    def _clear(self) -> None:
        self._requests: dict[str, Request] = {}
        self._group_of: dict[str, _Group] = {}
        self._groups: dict[str, _Group] = {}
        self._parts: dict[GroupKey, list[_Group]] = {}  # in deadline order
        self._next_part: dict[GroupKey, int] = {}
        self._snapshot: tuple[RequestGroup, ...] | None = None

    def load(
        self,
        requests: Sequence[Request],
        columns: RequestColumns,
        order: NDArray[np.intp],
        runs: Sequence[KeyRun],
    ) -> None:
        """Replace everything: `order` lists the rows key by key (in `runs` order), each key's
        rows in `deadline_order`; every key's run is cut by the split rule."""
        by_id = _by_id(requests)
        slices = _Slices.cut(runs, self.max_group_size)
        self._clear()
        self._requests = by_id
        for key, summary in zip(slices.keys, summarise_slices(columns, order, slices), strict=True):
            members = dict.fromkeys(summary.request_ids)
            group = _Group(summary.id, key, members, summary.ttft_deadline_at_s, summary)
            self._register(group, index=len(self._parts.setdefault(key, [])))

    def add(self, request: Request, key: GroupKey) -> str:
        """Place a request in its key's deadline range; split the part if it grew too big.
        Returns the id of the group the request ends up in."""
        if request.id in self._requests:
            raise ValueError(f"request {request.id!r} is already grouped")
        deadline_s = request.ttft_deadline_at_s
        group = self._part_for(key, deadline_s)
        self._requests[request.id] = request
        self._group_of[request.id] = group
        group.members[request.id] = None
        group.floor_s = min(group.floor_s, deadline_s)
        self._touch(group)
        if len(group.members) > self.max_group_size:
            self._split(group)
        return self._group_of[request.id].id

    def remove(self, request_id: str) -> None:
        group = self._group_of.pop(request_id, None)
        if group is None:
            raise KeyError(f"request {request_id!r} is not grouped")
        del self._requests[request_id]
        del group.members[request_id]
        if group.members:
            self._touch(group)
        else:
            self._drop(group)

    def groups(self) -> tuple[RequestGroup, ...]:
        if self._snapshot is None:
            self._snapshot = tuple(self._summary(g) for g in self._groups.values())
        return self._snapshot

    def _summary(self, group: _Group) -> RequestGroup:
        if group.summary is None:
            members = [self._requests[rid] for rid in group.members]
            group.summary = RequestGroup.of(group.id, members)
        return group.summary

    def _part_for(self, key: GroupKey, deadline_s: float) -> _Group:
        """The last part whose deadline floor is not after the request's deadline."""
        parts = self._parts.setdefault(key, [])
        for group in reversed(parts):
            if group.floor_s <= deadline_s:
                return group
        return parts[0] if parts else self._new_group(key, deadline_s, index=0)

    def _split(self, group: _Group) -> None:
        members = sorted(group.members, key=lambda rid: deadline_order(self._requests[rid]))
        sizes = halving_sizes(len(members), self.max_group_size)
        index = self._parts[group.key].index(group)
        bounds = list(itertools.accumulate(sizes, initial=0))
        for part, (start, stop) in enumerate(itertools.pairwise(bounds)):
            chunk = members[start:stop]
            floor_s = self._requests[chunk[0]].ttft_deadline_at_s
            target = group if part == 0 else self._new_group(group.key, floor_s, index + part)
            target.members = dict.fromkeys(chunk)
            target.floor_s = floor_s
            self._group_of.update(dict.fromkeys(chunk, target))
            self._touch(target)

    def _new_group(self, key: GroupKey, floor_s: float, index: int) -> _Group:
        part = self._next_part.get(key, 0)
        group = _Group(group_id(key, part), key, {}, floor_s)
        self._register(group, index)
        return group

    def _register(self, group: _Group, index: int) -> None:
        self._groups[group.id] = group
        self._parts.setdefault(group.key, []).insert(index, group)
        self._next_part[group.key] = self._next_part.get(group.key, 0) + 1
        self._group_of.update(dict.fromkeys(group.members, group))
        self._snapshot = None

    def _drop(self, group: _Group) -> None:
        del self._groups[group.id]
        self._parts[group.key].remove(group)
        self._snapshot = None

    def _touch(self, group: _Group) -> None:
        group.summary = None
        self._snapshot = None


def _by_id(requests: Sequence[Request]) -> dict[str, Request]:
    by_id = {r.id: r for r in requests}
    if len(by_id) != len(requests):
        counts = Counter(r.id for r in requests)
        duplicates = sorted(rid for rid, count in counts.items() if count > 1)
        raise ValueError(f"requests appear more than once: {duplicates[:5]}")
    return by_id


class PartitionedGrouping:
    """Remove, groups and the rebalance counter for policies built on a KeyedPartition."""

    def __init__(self, config: GroupingConfig) -> None:
        self._config = config
        self._partition = KeyedPartition(config.max_group_size)
        self._inserts_since_regroup = 0

    def _load(
        self,
        requests: Sequence[Request],
        columns: RequestColumns,
        order: NDArray[np.intp],
        runs: Sequence[KeyRun],
        planned: Sequence[Request] = (),
    ) -> tuple[RequestGroup, ...]:
        """Load the policy's keyed rows of `requests`, and the `planned` jobs' requests keyed
        by their parts (`job_key`), after them."""
        if planned:
            keys = {r.id: (r.model, f"job:{r.job_group}") for r in planned}
            keyed = sorted(planned, key=lambda r: (keys[r.id], deadline_order(r)))
            counts = Counter(keys[r.id] for r in keyed)
            runs = [*runs, *((key, counts[key]) for key in dict.fromkeys(counts))]
            tail = np.arange(len(requests), len(requests) + len(keyed), dtype=np.intp)
            order = np.concatenate((order, tail))
            requests = [*requests, *keyed]
            columns = RequestColumns.of(requests)
        self._partition.load(requests, columns, order, runs)
        self._inserts_since_regroup = 0
        return self._partition.groups()

    def _add(self, request: Request, key: GroupKey) -> str:
        """Add under `key`, or under its job part's key for a planned job's request."""
        group_id = self._partition.add(request, job_key(request) or key)
        self._inserts_since_regroup += 1
        return group_id

    def remove(self, request_id: str) -> None:
        self._partition.remove(request_id)

    def groups(self) -> tuple[RequestGroup, ...]:
        return self._partition.groups()

    @property
    def needs_regroup(self) -> bool:
        return self._inserts_since_regroup >= self._config.recluster_every_inserts
