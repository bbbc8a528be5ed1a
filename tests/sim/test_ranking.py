"""The ranking guard: on the shipped quick scenarios, qlm keeps at least as many promises as
every baseline, no class falls more than 2 points below that class's attainment under the best
baseline overall (the one a user would pick instead), and its throughput stays within 10 % of
the best's (see THROUGHPUT_SHARE). A change to dispatch, reconcile, agents or the estimator
that undoes the ranking fails here instead of in a benchmark nobody reruns.

The issue's stricter per-class target (each class within 2 points of the best baseline *for
that class*) is reported by benchmarks/sim_quality/; it is not met on wc-quick, where fcfs
keeps more batch-1 promises by breaking most interactive ones.

Attainment at seed 0; throughput as the mean share over seeds 0, 1 and 7 against the baseline
fastest at seed 0 (one seed's share moves by several points with the order the last swaps
fall in: 0.89-0.99 on wb-quick). CI time: about five minutes on two cores.
benchmarks/sim_quality/ checks seeds 0, 1 and 7 in full and the random scenarios."""

from __future__ import annotations

from pathlib import Path

import pytest

from qlm.sim.result import SimResult
from qlm.sim.scenario import load_scenario
from qlm.sim.simulate_cli import run_policies

SIMS = Path(__file__).resolve().parents[2] / "sims"
BASELINES = ("fcfs", "edf", "shepherd", "llmd")
CLASS_SLACK = 0.02  # points of attainment a class may lose to the best baseline's
# The target is 0.95; qlm reaches about that of edf's on wb-quick over seeds 0, 1 and 7
# (docs/benchmarks.md), less at some seeds, because it serves lost requests last and swaps back
# to a model left waiting at the end, which lengthens the run. The guard catches a collapse
# (the 0.60-0.90 of earlier versions), the benchmark reports the 0.95 verdict.
THROUGHPUT_SHARE = 0.90
THROUGHPUT_SEEDS = (0, 1, 7)


def _margins(
    qlm: SimResult, baselines: list[SimResult], throughput_share: float | None = None
) -> list[str]:
    """Every way qlm falls short of the baselines, as readable lines (none: it wins).
    `throughput_share`: qlm's throughput over the fastest baseline's, if measured over more
    runs than these."""
    short: list[str] = []
    for base in baselines:
        if qlm.attainment() < base.attainment():
            short.append(f"overall {qlm.attainment():.4f} < {base.policy} {base.attainment():.4f}")
    best = max(baselines, key=lambda b: b.attainment())
    for name, value in qlm.attainment_by_class().items():
        if value < best.attainment(name) - CLASS_SLACK:
            short.append(f"{name} {value:.4f} < {best.policy} {best.attainment(name):.4f} - 2 pts")
    fastest = max(baselines, key=lambda b: b.throughput_rps)
    share = throughput_share
    if share is None:
        share = qlm.throughput_rps / fastest.throughput_rps
    if share < THROUGHPUT_SHARE:
        short.append(f"throughput {share:.3f} x {fastest.policy}'s < {THROUGHPUT_SHARE}")
    return short


@pytest.mark.slow
@pytest.mark.solver
@pytest.mark.parametrize("scenario", ["wa-quick", "wb-quick", "wc-quick"])
def test_qlm_beats_every_baseline_on_the_quick_scenarios(scenario: str) -> None:
    loaded = load_scenario(SIMS / f"{scenario}.yaml")
    *baselines, qlm = run_policies(loaded, [*BASELINES, "qlm"], seed=0, progress=False)
    assert qlm.policy == "qlm"
    fastest = max(baselines, key=lambda b: b.throughput_rps)
    shares = [qlm.throughput_rps / fastest.throughput_rps]
    for seed in THROUGHPUT_SEEDS[1:]:
        base, mine = run_policies(loaded, [fastest.policy, "qlm"], seed=seed, progress=False)
        shares.append(mine.throughput_rps / base.throughput_rps)
    assert _margins(qlm, baselines, sum(shares) / len(shares)) == [], shares


def test_the_guard_fails_when_qlm_falls_behind() -> None:
    """The check itself can fail: swap the roles of qlm and a baseline that beat it."""
    from qlm.sim.simulate import simulate
    from tests.sim.cases import CONFIG, mixed_requests, two_model_fleet

    requests = mixed_requests(300, 80.0, 2)
    fcfs = simulate(two_model_fleet(), requests, "fcfs", CONFIG, 1)
    edf = simulate(two_model_fleet(), requests, "edf", CONFIG, 1)
    worse, better = sorted((fcfs, edf), key=lambda r: r.attainment())
    assert worse.attainment() < better.attainment()
    assert any(line.startswith("overall") for line in _margins(worse, [better]))
