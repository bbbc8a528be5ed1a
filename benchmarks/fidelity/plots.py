"""The report's figures: latency CDFs live against simulated, per-request scatter, the profile
fits, and the estimator's predictions against actual TTFT."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from benchmarks.fidelity.comparison import Triple
from benchmarks.fidelity.estimator import EstimatorCheck
from benchmarks.fidelity.outcomes import LiveRun
from benchmarks.fidelity.settings import JUST_BEFORE, UP_FRONT, Paths
from benchmarks.fidelity.simulated import sim_outcomes
from qlm.engine.profiling.measured import ProfileFit
from qlm.sim.result import SimResult


def plot_all(
    paths: Paths,
    runs: Mapping[str, Triple],
    fits: Mapping[str, ProfileFit],
    checks: Sequence[EstimatorCheck],
) -> list[str]:
    """Write the figures into the report's folder; their file names, in the report's order."""
    folder = paths.folder
    folder.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    figures: tuple[tuple[str, Callable[[], Any]], ...] = (
        ("latency_cdf.png", lambda: _latency_cdf(runs)),
        ("per_request.png", lambda: _per_request(runs)),
        ("profile_fit.png", lambda: _profile_fit(fits)),
        ("estimator.png", lambda: _estimator(checks)),
    )
    for name, draw in figures:
        fig = draw()
        fig.tight_layout()
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
    return [name for name, _ in figures]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _latency_cdf(runs: Mapping[str, Triple]) -> Any:
    """Per run, the CDFs of TTFT and end-to-end latency: live, simulated on each profile."""
    fig, axes = _pyplot().subplots(len(runs), 2, figsize=(9, 2.6 * len(runs)), squeeze=False)
    for row, (name, (live, sim, again)) in enumerate(runs.items()):
        lines = [("live vLLM", live.outcomes, "-"), (f"sim, {UP_FRONT}", sim_outcomes(sim), "--")]
        if again is not None:
            lines.append((f"sim, {JUST_BEFORE}", sim_outcomes(again), ":"))
        for col, attr in enumerate(("ttft_s", "e2e_s")):
            ax = axes[row][col]
            for label, outs, style in lines:
                values = np.sort([v for o in outs if (v := getattr(o, attr)) is not None])
                if len(values):
                    ax.plot(values, np.arange(1, len(values) + 1) / len(values), style, label=label)
            ax.set_xscale("log")
            ax.set_title(f"{name}: {'TTFT' if col == 0 else 'end-to-end'} (s)", fontsize=9)
            ax.grid(alpha=0.3)
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    return fig


def _per_request(runs: Mapping[str, Triple]) -> Any:
    """Each request's simulated (re-measured profile where there is one) against live times."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(9, 4))
    for ax, attr, title in ((axes[0], "ttft_s", "TTFT"), (axes[1], "e2e_s", "end-to-end")):
        for name, (live, sim, again) in runs.items():
            xs, ys = _paired(live, again or sim, attr)
            ax.scatter(xs, ys, s=6, alpha=0.6, label=name)
        ax.plot([1e-3, 1e3], [1e-3, 1e3], "k:", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("live (s)")
        ax.set_ylabel(f"simulated, {JUST_BEFORE} profile (s)")
        ax.set_title(f"per request: {title}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return fig


def _paired(live: LiveRun, sim: SimResult, attr: str) -> tuple[list[float], list[float]]:
    """(live, simulated) values of attr for the requests positive in both."""
    by_id = {o.id: o for o in sim_outcomes(sim)}
    xs, ys = [], []
    for o in live.outcomes:
        s = by_id.get(o.id)
        x = getattr(o, attr)
        y = None if s is None else getattr(s, attr)
        if x is not None and y is not None and x > 0 and y > 0:
            xs.append(x)
            ys.append(y)
    return xs, ys


def _profile_fit(fits: Mapping[str, ProfileFit]) -> Any:
    """Per model, each measured iteration against the fitted step model."""
    fig, axes = _pyplot().subplots(1, len(fits), figsize=(4.5 * len(fits), 4), squeeze=False)
    for ax, (model, fit) in zip(axes[0], fits.items(), strict=True):
        for kind in ("prefill", "decode", "mixed"):
            rows = [r for r in fit.rows() if r.kind == kind]
            ax.scatter(
                [1e3 * r.measured_s for r in rows],
                [1e3 * r.predicted_s for r in rows],
                label=kind,
                s=12,
            )
        ax.plot([0.1, 1e4], [0.1, 1e4], "k:", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured iteration (ms)")
        ax.set_ylabel("fitted model (ms)")
        q = fit.quality()
        ax.set_title(
            f"{model}: R^2 {q.r_squared or math.nan:.3f}, max err {q.max_relative_error:.0%}"
        )
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return fig


def _estimator(checks: Sequence[EstimatorCheck]) -> Any:
    """The estimator's predicted TTFT against the actual one, every run."""
    fig, ax = _pyplot().subplots(figsize=(5, 4.5))
    for check in checks:
        if check.pairs:
            pred, _, ttft = zip(*check.pairs, strict=True)
            ax.scatter(ttft, pred, s=8, alpha=0.6, label=check.run)
    ax.plot([1e-3, 1e3], [1e-3, 1e3], "k:", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("actual time to first token (s)")
    ax.set_ylabel("estimator's predicted TTFT (s)")
    ax.set_title("RWT estimator on live runs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig
