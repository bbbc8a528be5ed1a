"""Prefix reuse in a run's report: how much of the prompts the engines' prefix caches held,
per policy and per instance, beside what one infinite cache would hold (the oracle). Only for
scenarios whose streams carry prefixes (qlm/sim/workload/prefixes.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from qlm.sim.result import SimResult
from qlm.sim.scenario import Scenario
from qlm.sim.workload.prefixes import oracle_reuse

NOTE = (
    "Reuse: prompt tokens found in an engine's prefix cache over the prompt tokens admitted "
    "with a prefix (a request recomputed after an eviction counts again). Oracle: the share of "
    "the requests' prompt tokens one infinite cache, seeing every request in arrival order, "
    "would hold: the most any placement can reuse."
)


def scenario_oracle_reuse(scenario: Scenario, seed: int) -> float | None:
    """The oracle's reuse for the scenario's requests at this seed (None: no stream has
    prefixes)."""
    if all(stream.prefixes is None for stream in scenario.workload):
        return None
    rows = [(r.prompt_tokens, r.prefix) for r in scenario.requests(seed) if r.prefix]
    prompt_tokens, hit_tokens = oracle_reuse(rows)
    return hit_tokens / prompt_tokens if prompt_tokens else None


def prefix_markdown(results: Sequence[SimResult], oracle: float | None) -> str | None:
    """The table (None when no run carried prefixes): per policy, tokens, reuse, its share of
    the oracle's, and each instance's reuse."""
    reuses = [(r.policy, r.prefix_reuse()) for r in results]
    instances = sorted({i for _, reuse in reuses if reuse for i in reuse["by_instance"]})
    if not instances:
        return None
    head = ["policy", "prompt tokens", "hit tokens", "reuse", "of oracle", *instances]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for policy, reuse in reuses:
        if reuse is None:
            continue
        share = "-" if not oracle else f"{reuse['reuse'] / oracle:.2f}"
        cells = [policy, str(reuse["prompt_tokens"]), str(reuse["hit_tokens"])]
        cells += [f"{100 * reuse['reuse']:.1f}%", share]
        cells += [f"{100 * reuse['by_instance'].get(i, 0.0):.1f}%" for i in instances]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_prefix_to_report(path: Path, results: Sequence[SimResult], oracle: float | None) -> None:
    """Append the prefix-reuse section to report.md (nothing when no run carried prefixes)."""
    table = prefix_markdown(results, oracle)
    if table is None:
        return
    oracle_text = "-" if oracle is None else f"{100 * oracle:.1f}%"
    section = ["", "## Prefix reuse", "", f"Oracle: {oracle_text}", "", table, "", NOTE, ""]
    with path.open("a", encoding="utf-8") as f:
        f.write("\n".join(section))
