"""The clairvoyant bound (qlm/sim/bound.py) as a `bound` row under the summary tables: the
terminal table's and report.md's, beside the policies' attainment."""

from __future__ import annotations

import re
from pathlib import Path

from qlm.sim.bound import AttainmentBound

NOTE = (
    "bound: an upper bound on attainment that no policy can beat, from the whole trace "
    "(qlm/sim/bound.py): {infeasible} requests miss even when served alone on the best "
    "instance, {excluded} more cannot all get their work done by their deadlines on this fleet."
)


def _pct(value: float) -> str:
    return f"{100.0 * value:.1f}%"


def terminal_bound_row(table: str, bound: AttainmentBound) -> str:
    """A `bound` row aligned under a fixed-width summary table (right-aligned cells end where
    their header ends): attainment overall and per class, the other columns empty."""
    header = table.splitlines()[0] if table else ""
    values = bound.as_dict()
    row = list("bound".ljust(len(header)))
    for match in re.finditer(r"\S+", header):
        name = match.group(0)
        if name not in values:
            continue
        cell = _pct(values[name])
        start = max(len("bound") + 1, match.end() - len(cell))
        row[start : start + len(cell)] = cell
    return "".join(row).rstrip()


def _markdown_row(header: str, bound: AttainmentBound) -> str:
    names = [cell.strip() for cell in header.strip().strip("|").split("|")]
    values = bound.as_dict()
    cells = ["bound", *(_pct(values[n]) if n in values else "-" for n in names[1:])]
    return "| " + " | ".join(cells) + " |"


def add_bound_to_report(path: Path, bound: AttainmentBound) -> None:
    """Put a `bound` row under report.md's summary table (the first table whose first column
    is `policy`) and a note saying what it is; a section of its own if there is no table."""
    lines = path.read_text(encoding="utf-8").split("\n")
    note = NOTE.format(infeasible=bound.infeasible, excluded=bound.capacity_excluded)
    start = next((k for k, line in enumerate(lines) if line.startswith("| policy |")), None)
    if start is None:
        header = "| policy | " + " | ".join(bound.as_dict()) + " |"
        lines += ["## Clairvoyant bound", "", header, "|---" * (header.count("|") - 1) + "|"]
        lines += [_markdown_row(header, bound), "", note, ""]
    else:
        end = start
        while end + 1 < len(lines) and lines[end + 1].startswith("|"):
            end += 1
        lines[end + 1 : end + 1] = [_markdown_row(lines[start], bound), "", note]
    path.write_text("\n".join(lines), encoding="utf-8")
