"""How values travel between Python and Redis: records, events and requests to and from the
text Redis stores, floats written exactly, and typed views of redis-py's untyped replies.

Pure functions; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from qlm.queue.records import (
    RequestRecord,
    RequestResult,
    StreamEvent,
    StreamKind,
    request_from_dict,
    request_to_dict,
)
from qlm.types import TRANSITIONS, Request, RequestState

Entries = list[tuple[str, dict[str, str]]]  # stream entries: [(id, fields), ...]


def num(value: float) -> str:
    """A float as the exact text Redis and Lua will store and parse back."""
    return repr(float(value))


def finish_sources(to: RequestState) -> str:
    """The states that may move to `to`, as the FINISH script reads them. A request that
    completes while DISPATCHED passes through RUNNING (its first token came with its end)."""
    sources = {src for src, dsts in TRANSITIONS.items() if to in dsts}
    if to is RequestState.COMPLETED:
        sources.add(RequestState.DISPATCHED)
    return " " + " ".join(sorted(sources)) + " "


def record_from_fields(fields: Mapping[str, str]) -> RequestRecord:
    """A request's record from its hash."""
    request = request_from_dict({**json.loads(fields["req"]), "state": fields["state"]})
    result = fields.get("result")
    return RequestRecord(
        request=request,
        instance_id=fields.get("inst"),
        lease_expires_at_s=_float(fields.get("lease")),
        group_id=fields.get("group"),
        predicted_wait_s=_float(fields.get("wait")),
        dispatches=int(fields.get("disp", 0)),
        evictions=int(fields.get("evic", 0)),
        result=None if result is None else RequestResult.from_dict(json.loads(result)),
        first_token_at_s=_float(fields.get("first")),
    )


def _float(text: str | None) -> float | None:
    return None if text is None else float(text)


def event_from_fields(request_id: str, fields: Mapping[str, str]) -> StreamEvent:
    """An output event from its stream entry."""
    result = fields.get("r")
    return StreamEvent(
        request_id=request_id,
        kind=StreamKind(fields["k"]),
        attempt=int(fields["a"]),
        at_s=float(fields["t"]),
        text=fields.get("x", ""),
        num_tokens=int(fields.get("n", 0)),
        offset_tokens=int(fields.get("o", 0)),
        result=None if result is None else RequestResult.from_dict(json.loads(result)),
        extras=json.loads(fields["e"]) if "e" in fields else None,
    )


def event_args(event: StreamEvent) -> list[str | int]:
    """The EMIT script's arguments for one event."""
    return [
        str(event.kind),
        event.attempt,
        num(event.at_s),
        event.text,
        event.num_tokens,
        event.offset_tokens,
        "" if event.extras is None else json.dumps(event.extras, separators=(",", ":")),
    ]


def request_json(request: Request) -> str:
    """A request as the record's `req` field: JSON without its state."""
    data = request_to_dict(request)
    del data["state"]  # the record's `state` field is the one source of truth
    return json.dumps(data, separators=(",", ":"))


def result_json(result: RequestResult) -> str:
    return json.dumps(result.to_dict(), separators=(",", ":"))


def chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    return (items[i : i + size] for i in range(0, len(items), size))


def block_ms(seconds: float) -> int:
    """A block time for XREAD: at least 1 ms (0 would block forever)."""
    return max(1, round(seconds * 1000))


def as_range(reply: object) -> Entries:
    """XRANGE's reply: [(id, fields), ...]."""
    return cast(Entries, reply)


def as_strs(value: object) -> list[str]:
    """A list reply, as decode_responses=True gives it."""
    return cast(list[str], value)


def as_hash(value: object) -> dict[str, str]:
    return cast(dict[str, str], value)


def xread_entries(reply: object) -> Entries:
    """The entries of XREAD's reply for one stream ([[name, entries]] in RESP2)."""
    return cast(Entries, cast(list[Any], reply)[0][1]) if reply else []
