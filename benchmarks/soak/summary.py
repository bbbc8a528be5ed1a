"""The soak's verdict (memory flat, no errors but 429s, every accepted request completed) and its
report: latency summaries and the docs block, also printed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.common.stats import percentile
from benchmarks.report import header_lines
from benchmarks.soak.load import EXPECTED_PREFIX
from benchmarks.soak.memory import IN_FLIGHT, memory_rows

# Redis keeps every finished request's record and stream for finished_ttl_s (24 h by default),
# so its memory grows with the requests served, by design: reported, not judged.
NOT_JUDGED = frozenset({"redis-server"})


def latency_summary(values: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50_ms": _round(percentile(values, 0.5)),
        "p99_ms": _round(percentile(values, 0.99)),
        "max_ms": _round(max(values) if values else None),
    }


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    """Memory flat (qlm processes); errors other than 429; and every request the plane
    accepted completed: all the client saw accepted, plus at most the requests whose answer
    the client never got (transport errors), none failed, none left in the queue."""
    errors = report["errors"]
    unexpected = {k: v for k, v in errors.items() if not k.startswith(EXPECTED_PREFIX)}
    counts = report["final_counts"]
    unanswered = counts.get("completed", 0) + counts.get("cancelled", 0) - report["accepted_total"]
    live = sum(counts.get(s, 0) for s in ("queued", "dispatched", "running"))
    return {
        "memory_flat": all(m["flat"] for r, m in report["memory"].items() if r not in NOT_JUDGED),
        "unexpected_errors": sum(unexpected.values()),
        "all_accepted_completed": counts.get("failed", 0) == 0
        and live == 0
        and 0 <= unanswered <= report.get("transport_errors", 0),
    }


def render(report: dict[str, Any]) -> str:
    """The docs block (also printed): the header, memory over time, then the checks."""
    minutes = report["duration_s"] / 60.0
    options = report["options"]
    lines = [
        f"## Soak: mixed interactive + batch load for {minutes:.0f} minutes",
        "",
        *header_lines(report["header"]),
        "",
        f"Setup `{options['setup']}` on a throwaway redis-server; "
        f"examples/fleet.yaml, emulated engines at speedup {options['speedup']:g}; "
        f"offered {report['offered_per_s']:.1f} requests/s "
        f"(interactive {options['interactive_rps']:g}/s, batch "
        f"{options['batch_rps']:g}/s, plus {options['burst_size']} batch-2 "
        f"every {options['burst_every_s']:g} s into a queue bounded at "
        f"{options['max_queued']}).",
        "",
        *_memory_lines(report),
        "",
        *_check_lines(report),
    ]
    if report["error_details"]:
        lines += ["", "Unexpected errors (first few):", ""]
        lines += [f"- `{detail}`" for detail in report["error_details"][:5]]
    return "\n".join(lines)


def _memory_lines(report: dict[str, Any]) -> list[str]:
    """Resident memory over time, then each process's start, end, slope and verdict."""
    roles = list(report["memory"])
    lines = [
        "Resident memory (MiB) over time:",
        "",
        "| t (s) | " + " | ".join(roles) + " | client requests open (peak) |",
        "|---:|" + "---:|" * (len(roles) + 1),
    ]
    for row in memory_rows(report["memory_samples"]):
        cells = ["-" if row.get(r) is None else f"{row[r]:.1f}" for r in roles]
        cells.append(str(row.get(IN_FLIGHT, "-")))
        lines.append(f"| {row['t_s']:.0f} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| process | start | after warm-up | end | slope after warm-up (MiB/h) | flat |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for role, m in report["memory"].items():
        flat = "not judged" if role in NOT_JUDGED else "yes" if m["flat"] else "NO"
        lines.append(
            f"| {role} | {m['start_mib']:.1f} | {m['after_warmup_mib']:.1f} | {m['end_mib']:.1f} "
            f"| {m['slope_mib_per_hour']:+.1f} | {flat} |"
        )
    return [
        *lines,
        "",
        "redis-server keeps each finished request (record and output stream) for "
        "finished_ttl_s (24 h by default): its memory grows with the requests served.",
    ]


def _check_lines(report: dict[str, Any]) -> list[str]:
    """Requests, errors, latencies and the verdict."""
    enq, ttft, v = report["enqueue_latency"], report["interactive_ttft"], report["verdict"]
    burst = report["enqueue_latency_burst"]
    errors = ", ".join(f"{k}: {n}" for k, n in sorted(report["errors"].items())) or "none"
    return [
        f"Requests offered {sum(report['offered'].values())}, accepted "
        f"{report['accepted_total']}; final queue counts {report['final_counts']}.  ",
        f"Errors by type: {errors} (expected: 429 only; unexpected: {v['unexpected_errors']}).  ",
        f"Enqueue latency (POST /v1/qlm/requests to 202, client side), steady arrivals: p50 "
        f"{enq['p50_ms']} ms, p99 {enq['p99_ms']} ms, max {enq['max_ms']} ms over {enq['n']} "
        f"requests; during bursts: p50 {burst['p50_ms']} ms, p99 {burst['p99_ms']} ms over "
        f"{burst['n']}.  ",
        f"Interactive streams, time to first token: p50 {ttft['p50_ms']} ms, p99 "
        f"{ttft['p99_ms']} ms.  ",
        f"Verdict: memory flat {v['memory_flat']}, every accepted request completed "
        f"{v['all_accepted_completed']}, unexpected errors {v['unexpected_errors']}.",
    ]
