"""One page of a caller's requests, newest first: the filter both queues share.

A page is cut from candidates in descending arrival sequence (`seq`, the order requests were
enqueued). The cursor is the sequence number of the page's last request: the next page asks
for requests enqueued before it, so pages stay stable while new requests arrive.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from qlm.queue.records import RequestRecord
from qlm.types import RequestState


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """Which requests a page holds: a tenant's (None: every tenant's), in `states` (empty:
    any state), enqueued before `before_seq` (None: from the newest), `limit` at most."""

    tenant: str | None = None
    states: frozenset[RequestState] = frozenset()
    before_seq: int | None = None
    limit: int = 20

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError("limit must be >= 1")

    def keeps(self, record: RequestRecord) -> bool:
        if self.tenant is not None and record.request.tenant != self.tenant:
            return False
        return not self.states or record.state in self.states


@dataclass(frozen=True, slots=True)
class RecordPage:
    records: tuple[RequestRecord, ...]
    next_before_seq: int | None  # the cursor of the next page; None: this is the last one


def take_page(candidates: Iterable[tuple[int, RequestRecord]], page: RecordFilter) -> RecordPage:
    """The page from (seq, record) pairs in descending seq; reads one past the limit to know
    whether another page follows."""
    kept: list[tuple[int, RequestRecord]] = []
    for seq, record in candidates:
        if page.before_seq is not None and seq >= page.before_seq:
            continue
        if not page.keeps(record):
            continue
        if len(kept) == page.limit:
            return RecordPage(tuple(r for _, r in kept), kept[-1][0])
        kept.append((seq, record))
    return RecordPage(tuple(r for _, r in kept), None)
