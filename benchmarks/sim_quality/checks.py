"""Does qlm clear the issue's bar on each scenario (fcfs < 80% at the load, qlm >= edf >= fcfs,
qlm >= llmd), by how much does it beat each baseline, and where does another policy beat it?"""

from __future__ import annotations

from typing import Any

POLICY_ORDER = (
    "fcfs",
    "edf",
    "shepherd",
    "llmd",
    "qlm",
    "qlm-no-evict",
    "qlm-no-swap",
    "qlm-edf",
)


BASELINES = ("fcfs", "edf", "shepherd", "llmd")  # what qlm is measured against
ISSUE_BAR = 0.80
NOISE = 0.001  # attainment differences below 0.1 point are not reported as wins


def overall(policies: dict[str, Any], name: str) -> float | None:
    entry = policies.get(name)
    return None if entry is None else float(entry["slo_attainment"]["overall"])


def checks(name: str, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's bar for one scenario: fcfs < 80%, qlm >= edf >= fcfs, qlm >= llmd."""
    pol = entry["policies"]
    rows = []
    for label, lhs, rhs in (("qlm >= edf", "qlm", "edf"), ("edf >= fcfs", "edf", "fcfs")):
        rows.append(_compare(name, label, overall(pol, lhs), overall(pol, rhs)))
    rows.append(_compare(name, "qlm >= llmd", overall(pol, "qlm"), overall(pol, "llmd")))
    fcfs = overall(pol, "fcfs")
    rows.insert(
        0,
        {
            "scenario": name,
            "check": "fcfs < 80% (load)",
            "measured": "-" if fcfs is None else f"fcfs {fcfs:.1%}",
            "result": "-" if fcfs is None else ("PASS" if fcfs < ISSUE_BAR else "MISS"),
        },
    )
    return rows


def _compare(name: str, label: str, a: float | None, b: float | None) -> dict[str, Any]:
    if a is None or b is None:
        return {"scenario": name, "check": label, "measured": "-", "result": "-"}
    lhs, rhs = label.split(" >= ")
    return {
        "scenario": name,
        "check": label,
        "measured": f"{lhs} {a:.1%}, {rhs} {b:.1%}",
        "result": "PASS" if a >= b else "MISS",
    }


def gains(entry: dict[str, Any]) -> str:
    """qlm against each baseline: attainment points and throughput change."""
    pol = entry["policies"]
    if "qlm" not in pol:
        return "-"
    q = pol["qlm"]
    parts = []
    for base in ("fcfs", "edf", "shepherd", "llmd"):
        if base not in pol:
            continue
        b = pol[base]
        d_att = 100.0 * (q["slo_attainment"]["overall"] - b["slo_attainment"]["overall"])
        # the paper states relative gains (+40-90% attainment): give both
        rel = _pct_change(q["slo_attainment"]["overall"], b["slo_attainment"]["overall"])
        d_thr = _pct_change(q["throughput_rps"], b["throughput_rps"])
        parts.append(f"vs {base} {d_att:+.1f} pts ({rel}) attainment, {d_thr} throughput")
    return "; ".join(parts)


def _pct_change(a: float, b: float) -> str:
    return "-" if b <= 0 else f"{100.0 * (a - b) / b:+.0f}%"


def ordered(policies: dict[str, Any]) -> list[tuple[str, Any]]:
    rank = {p: i for i, p in enumerate(POLICY_ORDER)}
    return sorted(policies.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


def not_won(scenarios: dict[str, Any]) -> list[str]:
    """Scenarios and classes where some policy beats qlm."""
    lines = []
    for name, entry in scenarios.items():
        pol = entry["policies"]
        if "qlm" not in pol:
            continue
        q = pol["qlm"]["slo_attainment"]
        for other, s in ordered(pol):
            if other == "qlm":
                continue
            better = [
                f"{c} {s['slo_attainment'][c]:.1%} > {q.get(c, 0.0):.1%}"
                for c in s["slo_attainment"]
                if s["slo_attainment"][c] > q.get(c, 0.0) + NOISE
            ]
            if better:
                lines.append(f"- {name}: {other} beats qlm on " + ", ".join(better))
            q_thr, o_thr = pol["qlm"]["throughput_rps"], s["throughput_rps"]
            if o_thr > q_thr * 1.01:
                lines.append(
                    f"- {name}: {other} has {_pct_change(o_thr, q_thr)} throughput over qlm "
                    f"({o_thr:.2f} vs {q_thr:.2f} rps)"
                )
    return lines
