"""The Markdown the benchmarks print and write into docs: tables of result rows, and the rows of
a targets table (a target, what it was checked on, the measured figure, PASS / MISS)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Formatter = Callable[[object, str], str]  # (value, column) -> cell text


def markdown_table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], fmt: Formatter
) -> str:
    """One row per mapping, one column per key (a missing key is formatted as None)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c), c) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def target_row(target: str, subject: str, measured: str, ok: bool | None) -> dict[str, str]:
    """A row of a targets table; `ok` None: the target was not measured in this run."""
    result = "not run" if ok is None else ("PASS" if ok else "MISS")
    return {"target": target, "subject": subject, "measured": measured, "result": result}
