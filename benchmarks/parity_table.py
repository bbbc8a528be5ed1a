"""The parity benchmark's docs table: one row per case (live against simulated, the wait
estimate's accuracy in each plane, the replay's health, the best simulated baseline, the
timing spread) and its legend. benchmarks/parity.py runs the cases and writes the block."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.parity_spread import describe, inside


def versus_baselines(case: dict[str, Any]) -> str:
    """The best simulated baseline and whether live kept at least as many promises."""
    baselines = case.get("baselines")
    if not baselines:
        return "-"
    best = max(baselines, key=lambda p: baselines[p])
    ok = case["live"]["overall"] >= baselines[best] - 1e-9
    return f"{best} {100 * baselines[best]:.1f} % {'yes' if ok else 'NO'}"


def _worst_error(prediction: dict[str, Any]) -> str:
    if not prediction:
        return "-"
    worst = max(prediction.values(), key=lambda p: p["median_abs_error_of_target"])
    held = min(p["held"] for p in prediction.values())
    bounds = [p["bound_held"] for p in prediction.values() if p.get("bound_held") is not None]
    bound = f" / {100 * min(bounds):.0f} %" if bounds else ""
    return f"{100 * worst['median_abs_error_of_target']:.0f} % / {100 * held:.0f} %{bound}"


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _replay_health(case: dict[str, Any]) -> str:
    """Client errors / the worst class's arrival lag p99 (the admission lag's for runs made
    before the arrival lag was measured) / faithful; '-' where a run did not measure it."""
    live = case["live"]
    if "client_errors" not in live:
        return "-"
    lags = live.get("arrival_lag_p99_s") or {}
    lag_s = max(lags.values()) if lags else live.get("admission_lag_p99_s")
    lag = "-" if lag_s is None else f"{lag_s:.1f} s" + ("" if lags else " (adm.)")
    faithful = case.get("faithful")
    verdict = "-" if faithful is None else "yes" if faithful else "NO: " + ", ".join(case["late"])
    return f"{live['client_errors']:g} / {lag} / {verdict}"


def table(cases: Sequence[dict[str, Any]]) -> str:
    head = [
        "case", "seed", "x", "live", "sim", "gap", "worst class gap", "spread",
        "swaps live/sim", "TTFT p50 live/sim",
        "wait err / held / p90 held live", "wait err / held / p90 held sim",
        "replay errors / arrival lag p99 / faithful", "best sim baseline, live >=", "within",
        "sim spread (timing +-10 %)", "live inside spread", "code",
    ]  # fmt: skip
    rows = []
    for c in cases:
        gap = c["gap_points"]
        classes = {k: v for k, v in gap.items() if k != "overall"}
        worst = max(classes, key=lambda k: abs(classes[k])) if classes else "-"
        live, sim = c["live"], c["simulated"]
        rows.append([
            c["case"], str(c["seed"]), f"{c['speedup']:g}",
            f"{100 * live['overall']:.1f} %", f"{100 * sim['overall']:.1f} %",
            f"{gap['overall']:+.1f}", f"{worst} {classes.get(worst, 0.0):+.1f}",
            f"{c['live_overall_spread_points']:.1f}",
            f"{c['live_swaps']:g} / {sim['swaps']}",
            f"{live['ttft_p50_s'] or 0:.2f} / {sim['ttft_p50_s'] or 0:.2f} s",
            _worst_error(live["prediction"]), _worst_error(sim["prediction"]),
            _replay_health(c), versus_baselines(c),
            "yes" if c["within"] else "NO", describe(c.get("sim_spread")),
            {None: "-", True: "yes", False: "NO"}[inside(c)], str(c.get("code", "-")),
        ])  # fmt: skip
    return markdown_table(head, rows)


LEGEND = (
    "x: speedup. gap: live less simulated, attainment points (live: the median repeat). "
    "wait err / held: the wait estimate's median absolute error as a share of the class's TTFT "
    "target (worst class) / how often the TTFT came within it (least class) / how often within "
    "the bound for nine in ten (least class; absent: no bound given); live: the API's "
    "x-qlm-estimated-wait-s and -p90-s, simulated: the dispatch schedule's prediction and its "
    "bound; a predicted miss ('late') says \"past the target\": graded by how far short of the "
    "target the TTFT came (runs before 4840db9 graded it as the target itself). "
    "replay errors / arrival lag p99 / faithful: requests the client could not send; "
    "scenario seconds from a request's time in the scenario to the plane's arrival stamp (worst "
    "class; '(adm.)': from the client's send only, runs before the arrival lag was measured); "
    "faithful when every class's lag is within 10 % of its TTFT target and no request was lost "
    "(otherwise the plane ran another workload than the simulator and the case is not within "
    "bounds, whatever its gap; '-': not measured by that run). "
    "best sim baseline: the simulated baseline with the highest overall attainment on the same "
    "requests, and whether live qlm kept at least as many ('-': not run by that run). "
    "Bounds: 2 points overall, 3 in every class, swaps within one or 25 %. "
    "sim spread: the simulated qlm's lowest-highest overall attainment / swaps over the case "
    "as given and with the control loop's tick_s or min_replan_interval_s 10 % shorter or "
    "longer (benchmarks/parity_spread.py; simulated on the code its `code` field names, which "
    "may be newer than the live runs'); live inside spread: the live median run's overall "
    "and swaps within that range widened by the bounds, i.e. a gap the decision's own "
    "sensitivity to timing accounts for. "
    "code: the commit the case ran on (its results file's)."
)
