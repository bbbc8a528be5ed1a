"""Live against simulated on the same requests: attainment overall and per class, swaps,
evictions, TTFT quantiles and the wait predictions' error, as a table and a JSON document."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from qlm.sim.result import SimResult

REPLAY_STATS = ("client_errors", "send_lag_p99_s", "admission_lag_p99_s")
ARRIVAL_LAG = "arrival_lag_p99_s"  # per class, `<name>.<class>` in the run's stats
# A replay is faithful when every class's requests reached the plane within this share of the
# class's TTFT target of their time in the scenario (p99): later, the plane was served a
# different workload (arrivals bunched, deadlines moved with them) than the simulator.
FAITHFUL_LAG_SHARE = 0.1


def prediction_error(result: SimResult, targets_s: Mapping[str, float]) -> dict[str, Any]:
    """Per class: the median absolute error of the predicted TTFT (the run's
    `ttft_predictions`) against the TTFT seen, as a share of the class's target, how often
    the prediction held (`held`: the TTFT came within it), and within the bound given for
    nine in ten (`bound_held`, over those given one; None when none was); over requests
    with both a prediction and a first token. A predicted miss says "past the target", an
    interval: its error is how far short of the target the TTFT came (none when it missed),
    and it held when the request missed (one never served included); `late` counts them and
    `late_held` is that share (None without any)."""
    errors: dict[str, list[float]] = {}
    held: dict[str, list[bool]] = {}
    late: dict[str, list[bool]] = {}
    bounds: dict[str, list[bool]] = {}
    for outcome in result.outcomes:
        prediction = result.ttft_predictions.get(outcome.request_id)
        ttft_s = outcome.ttft_s
        target_s = targets_s.get(outcome.slo_class)
        if prediction is None or not target_s:
            continue
        name = outcome.slo_class
        if ttft_s is None:  # never served: a predicted miss held; nothing else to grade
            if prediction.predicted_s is None:
                late.setdefault(name, []).append(True)
            continue
        predicted_s = prediction.predicted_s
        if predicted_s is None:  # "past the target"
            error_s, kept_it = max(0.0, target_s - ttft_s), ttft_s > target_s
            late.setdefault(name, []).append(kept_it)
        else:
            error_s, kept_it = abs(predicted_s - ttft_s), ttft_s <= predicted_s
        errors.setdefault(name, []).append(error_s / target_s)
        held.setdefault(name, []).append(kept_it)
        bounded = bounds.setdefault(name, [])
        if prediction.upper_s is not None:
            bounded.append(ttft_s <= prediction.upper_s)
    return {
        name: {
            "requests": len(values),
            "median_abs_error_of_target": statistics.median(values),
            "held": _share(held[name]),
            "late": len(late.get(name, ())),
            "late_held": _share(late.get(name, [])),
            "bounded": len(bounds[name]),
            "bound_held": _share(bounds[name]),
        }
        for name, values in sorted(errors.items())
    }


def _share(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def run_figures(result: SimResult, targets_s: Mapping[str, float]) -> dict[str, Any]:
    """What the comparison reads of one run."""
    ttfts = sorted(o.ttft_s for o in result.outcomes if o.ttft_s is not None)
    return {
        "policy": result.policy,
        "requests": result.num_requests,
        "overall": result.attainment(),
        "by_class": result.attainment_by_class(),
        "swaps": result.total_swaps,
        "evictions": result.evictions,
        "ttft_p50_s": quantile(ttfts, 0.5),
        "ttft_p99_s": quantile(ttfts, 0.99),
        "prediction": prediction_error(result, targets_s),
        # the replay's own health (live only): client errors, send and admission lags
        **{k: v for k, v in result.policy_stats.items() if k in REPLAY_STATS},
        **_arrival_lags(result.policy_stats),
    }


def _arrival_lags(stats: Mapping[str, float]) -> dict[str, Any]:
    lags = {
        key.removeprefix(f"{ARRIVAL_LAG}."): value
        for key, value in stats.items()
        if key.startswith(f"{ARRIVAL_LAG}.")
    }
    return {ARRIVAL_LAG: lags} if lags else {}


def replay_health(live: Mapping[str, Any], targets_s: Mapping[str, float]) -> dict[str, Any]:
    """Whether the replay kept the scenario's arrival times closely enough to compare: every
    class's p99 arrival lag within `FAITHFUL_LAG_SHARE` of its TTFT target, and no request
    lost by the client. `late` names the classes past it; None when the run measured no lag."""
    lags: Mapping[str, float] = live.get(ARRIVAL_LAG) or {}
    if not lags:
        return {"faithful": None, "late": [], "lag_share": FAITHFUL_LAG_SHARE}
    late = sorted(
        c for c, lag_s in lags.items() if lag_s > FAITHFUL_LAG_SHARE * targets_s.get(c, math.inf)
    )
    lost = live.get("client_errors", 0.0) > 0
    return {"faithful": not late and not lost, "late": late, "lag_share": FAITHFUL_LAG_SHARE}


def comparison(
    live: SimResult, simulated: SimResult, targets_s: Mapping[str, float]
) -> dict[str, Any]:
    """Both runs' figures and the gaps (live less simulated, in attainment points)."""
    a, b = run_figures(live, targets_s), run_figures(simulated, targets_s)
    classes = sorted(set(a["by_class"]) | set(b["by_class"]))
    return {
        "live": a,
        "simulated": b,
        "replay": replay_health(a, targets_s),
        "gap_points": {
            "overall": 100 * (a["overall"] - b["overall"]),
            **{c: 100 * (a["by_class"].get(c, 0.0) - b["by_class"].get(c, 0.0)) for c in classes},
        },
    }


def comparison_table(doc: Mapping[str, Any]) -> str:
    """The comparison as a fixed-width table, one row per run and one for the gap."""
    classes = sorted(doc["gap_points"].keys() - {"overall"})
    head = ["run", "overall", *classes, "swaps", "evictions", "ttft p50", "ttft p99"]
    rows = [head]
    for key in ("live", "simulated"):
        run = doc[key]
        cells = [run["policy"], _pct(run["overall"])]
        cells += [_pct(run["by_class"].get(c)) for c in classes]
        cells += [str(run["swaps"]), str(run["evictions"])]
        cells += [_secs(run["ttft_p50_s"]), _secs(run["ttft_p99_s"])]
        rows.append(cells)
    gap = doc["gap_points"]
    rows.append(["gap (points)", f"{gap['overall']:+.1f}", *(f"{gap[c]:+.1f}" for c in classes)])
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(head))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    ]
    return "\n".join([*lines, *_health_lines(doc)])


def _health_lines(doc: Mapping[str, Any]) -> list[str]:
    """A warning under the table when the replay was not faithful."""
    health, live = doc.get("replay") or {}, doc["live"]
    if health.get("faithful") is not False:
        return []
    lags = live.get(ARRIVAL_LAG) or {}
    late = ", ".join(f"{c} {lags[c]:.1f} s" for c in health["late"])
    return [
        f"NOT FAITHFUL: requests reached the plane late (p99, scenario seconds: {late or '-'}; "
        f"allowed: {100 * health['lag_share']:.0f} % of the class's TTFT target; client errors: "
        f"{live.get('client_errors', 0):g}): the plane ran another workload than the simulator. "
        "Lower --speedup or give the replay a machine of its own."
    ]


def quantile(values: Sequence[float], q: float) -> float | None:
    """The value a share `q` of the sorted `values` are at or below (None: no values)."""
    if not values:
        return None
    return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"
