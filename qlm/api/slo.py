"""SLO tags: which class a request belongs to and the deadlines that follow.

Where a tag comes from, first match wins:

| what | body field | headers, in order |
|---|---|---|
| class | `slo_class` | `x-qlm-slo-class` |
| TTFT target | `slo_ttft_s` (s) | `x-qlm-slo-ttft-ms`, then `x-llm-d-slo-ttft-ms` (ms) |
| completion deadline | `deadline_s` (s from arrival) | none |

No class tag means the default class. A TTFT target or deadline only tightens the class's
targets: TTFT = min(class ttft_s, target, deadline); completion = min(class completion_s,
deadline). Deadlines are absolute times on the injected clock: arrival + relative target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from qlm.api.errors import ApiError
from qlm.types import SloClass

HEADER_CLASS = "x-qlm-slo-class"
HEADER_TTFT_MS = "x-qlm-slo-ttft-ms"
HEADER_LLMD_TTFT_MS = "x-llm-d-slo-ttft-ms"


@dataclass(frozen=True, slots=True)
class SloTags:
    """The tags of one request as the body gave them (None: not given)."""

    slo_class: str | None = None
    slo_ttft_s: float | None = None
    deadline_s: float | None = None


@dataclass(frozen=True, slots=True)
class Deadlines:
    slo: SloClass
    ttft_deadline_at_s: float
    completion_deadline_at_s: float | None


class SloResolver:
    """Turns body tags and headers into a class and absolute deadlines."""

    def __init__(self, classes: Mapping[str, SloClass], default: str, max_target_s: float) -> None:
        self._classes = dict(classes)
        self._default = classes[default]
        self._max_s = max_target_s
        self._known = ", ".join(sorted(classes))

    def resolve(self, tags: SloTags, headers: Mapping[str, str], now_s: float) -> Deadlines:
        slo = self._class_of(tags, headers)
        ttft_s = slo.ttft_s
        target_s = self._ttft_target_s(tags, headers)
        if target_s is not None:
            ttft_s = min(ttft_s, target_s)
        completion_s = slo.completion_s
        if tags.deadline_s is not None:
            self._check_range(tags.deadline_s, "deadline_s")
            completion_s = min(completion_s or math.inf, tags.deadline_s)
        if completion_s is not None:
            ttft_s = min(ttft_s, completion_s)
        completion_at_s = None if completion_s is None else now_s + completion_s
        return Deadlines(slo, now_s + ttft_s, completion_at_s)

    def _class_of(self, tags: SloTags, headers: Mapping[str, str]) -> SloClass:
        name, param = tags.slo_class, "slo_class"
        if name is None:
            name, param = headers.get(HEADER_CLASS), HEADER_CLASS
        if name is None:
            return self._default
        slo = self._classes.get(name)
        if slo is None:
            raise ApiError(
                400,
                f"Unknown SLO class {name!r}; known: {self._known}.",
                param=param,
                code="unknown_slo_class",
            )
        return slo

    def _ttft_target_s(self, tags: SloTags, headers: Mapping[str, str]) -> float | None:
        if tags.slo_ttft_s is not None:
            self._check_range(tags.slo_ttft_s, "slo_ttft_s")
            return tags.slo_ttft_s
        for header in (HEADER_TTFT_MS, HEADER_LLMD_TTFT_MS):
            raw = headers.get(header)
            if raw is not None:
                return self._header_ms(raw, header) / 1000.0
        return None

    def _header_ms(self, raw: str, header: str) -> float:
        try:
            value_ms = float(raw)
        except ValueError:
            raise ApiError(
                400, f"Header {header} must be a number of milliseconds.", param=header
            ) from None
        self._check_range(value_ms, header, "ms", self._max_s * 1000.0)
        return value_ms

    def _check_range(
        self, value: float, param: str, unit: str = "s", limit: float | None = None
    ) -> None:
        limit = self._max_s if limit is None else limit
        if not (0 < value <= limit):
            raise ApiError(
                400,
                f"{param} must be > 0 and <= {limit:g} {unit}; got {value:g}.",
                param=param,
                code="invalid_slo_target",
            )
