"""The summary as a table: fixed-width for the terminal (`summary_table`), Markdown for
report.md (`markdown_table`). Attainment overall and per class, throughput, TTFT, swaps. And
why requests missed, per policy (`causes_markdown_table`)."""

from __future__ import annotations

from collections.abc import Sequence

from qlm.sim.miss_causes import MissCause, miss_cause_counts
from qlm.sim.report.summary import policy_summary
from qlm.sim.result import SimResult


def class_names(results: Sequence[SimResult]) -> list[str]:
    """SLO classes present in any result, in configuration order."""
    present = {o.slo_class for r in results for o in r.outcomes}
    order = results[0].slo_classes if results else ()
    return [c for c in order if c in present]


def summary_table(results: Sequence[SimResult]) -> str:
    """A fixed-width table: attainment overall and per class, throughput, TTFT, swaps."""
    classes = class_names(results)
    head = ["policy", "overall", *classes, "thru_rps", "good_rps", "ttft_p50", "ttft_p99"]
    head += ["swaps", "evict", "wall_s"]
    rows = [head]
    for r in results:
        s = policy_summary(r)
        att = s["slo_attainment"]
        rows.append(
            [
                r.policy,
                _pct(att["overall"]),
                *(_pct(att.get(c)) for c in classes),
                f"{s['throughput_rps']:.2f}",
                f"{s['goodput_rps']:.2f}",
                _secs(s["ttft_p50_s"]),
                _secs(s["ttft_p99_s"]),
                str(s["swaps"]),
                str(s["evictions"]),
                f"{r.sim_wall_s:.1f}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join(lines)


def markdown_table(results: Sequence[SimResult]) -> str:
    classes = class_names(results)
    head = ["policy", "overall", *classes, "throughput rps", "goodput rps"]
    head += ["TTFT p50 s", "TTFT p99 s", "TBT p50 ms", "TBT p99 ms", "swaps", "evictions"]
    head += ["sim wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        s = policy_summary(r)
        att = s["slo_attainment"]
        cells = [
            r.policy,
            _pct(att["overall"]),
            *(_pct(att.get(c)) for c in classes),
            f"{s['throughput_rps']:.3f}",
            f"{s['goodput_rps']:.3f}",
            _secs(s["ttft_p50_s"]),
            _secs(s["ttft_p99_s"]),
            _millis(s["tbt_p50_ms"]),
            _millis(s["tbt_p99_ms"]),
            str(s["swaps"]),
            str(s["evictions"]),
            f"{r.sim_wall_s:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def causes_markdown_table(results: Sequence[SimResult]) -> str:
    """Missed requests per policy, by cause (qlm/sim/miss_causes.py), in precedence order; a
    count with its share of the policy's misses."""
    causes = [str(c) for c in MissCause]
    head = ["policy", "missed", *causes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        counts = miss_cause_counts(r.outcomes, r.end_s)
        missed = sum(counts.values())
        cells = [r.policy, str(missed)]
        cells += [_count(counts[c], missed) for c in causes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _count(count: int, total: int) -> str:
    return "0" if count == 0 else f"{count} ({100.0 * count / total:.0f}%)"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.1f}%"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _millis(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
