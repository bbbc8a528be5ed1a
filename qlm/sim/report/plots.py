"""The PNG plots of a run and of a rate sweep.

Plots use matplotlib's object API (Figure + the Agg canvas), never pyplot's global state, and
PNGs carry no Software metadata.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from qlm.sim.report.summary import policy_summary
from qlm.sim.report.tables import class_names
from qlm.sim.result import SimResult

PLOTS = {
    "attainment": "attainment.png",
    "ttft": "ttft_cdf.png",
    "queue": "queue_length.png",
    "swaps": "swaps_per_instance.png",
}


def _figure(width: float = 8.0, height: float = 4.5) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})


def plot_attainment(path: Path, results: Sequence[SimResult]) -> None:
    """Grouped bars: SLO attainment overall and per class, one bar per policy."""
    classes = ["overall", *class_names(results)]
    fig = _figure()
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(results))
    x = np.arange(len(classes))
    for k, r in enumerate(results):
        att = policy_summary(r)["slo_attainment"]
        values = [100.0 * (att.get(c) or 0.0) for c in classes]
        ax.bar(x + (k - (len(results) - 1) / 2) * width, values, width, label=r.policy)
    ax.set_xticks(x, classes)
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(0, 105)
    ax.set_title("SLO attainment by class")
    ax.legend(fontsize="small", ncols=min(4, len(results)))
    _save(fig, path)


def plot_ttft_cdf(
    path: Path, results: Sequence[SimResult], slo_ttft_s: Mapping[str, float]
) -> None:
    """Empirical CDF of time to first token per policy (requests that never produced a token
    keep the curve below 1); dotted lines at each class's TTFT target."""
    fig = _figure()
    ax = fig.add_subplot()
    for r in results:
        ttfts = np.sort([o.ttft_s for o in r.outcomes if o.ttft_s is not None])
        if len(ttfts) == 0:
            continue
        y = np.arange(1, len(ttfts) + 1) / max(1, r.num_requests)
        ax.step(np.maximum(ttfts, 1e-3), y, where="post", label=r.policy)
    for name, target in slo_ttft_s.items():
        ax.axvline(target, linestyle=":", color="grey")
        ax.text(target, 0.02, f" {name}", rotation=90, fontsize="x-small", color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s, log scale)")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title("TTFT distribution")
    ax.legend(fontsize="small")
    _save(fig, path)


def plot_queue(path: Path, results: Sequence[SimResult]) -> None:
    """Waiting requests (arrived, no token yet) over time by class, one panel per policy."""
    fig = _figure(8.0, 2.2 * max(1, len(results)) + 0.6)
    axes = fig.subplots(max(1, len(results)), 1, sharex=True, squeeze=False)[:, 0]
    for ax, r in zip(axes, results, strict=False):
        samples = r.queue_samples
        if samples:
            step = max(1, len(samples) // 2000)
            t = np.asarray([s.at_s for s in samples[::step]])
            waiting = np.asarray([s.waiting for s in samples[::step]])
            for k, name in enumerate(r.slo_classes):
                if waiting[:, k].any():
                    ax.plot(t, waiting[:, k], label=name, linewidth=1, drawstyle="steps-post")
        ax.set_ylabel("waiting")
        ax.set_title(r.policy, fontsize="small", loc="left")
        ax.legend(fontsize="x-small", loc="upper right")
    axes[-1].set_xlabel("simulated time (s)")
    _save(fig, path)


def plot_swaps(path: Path, results: Sequence[SimResult]) -> None:
    """Model loads per instance: grouped bars for small fleets, a heat map for large ones."""
    instances = sorted({i for r in results for i in r.swaps})
    fig = _figure(max(8.0, min(20.0, 0.25 * len(instances))), 4.5)
    ax = fig.add_subplot()
    counts = np.asarray([[r.swaps.get(i, 0) for i in instances] for r in results], dtype=float)
    if len(instances) <= 24:
        width = 0.8 / max(1, len(results))
        x = np.arange(len(instances))
        for k, r in enumerate(results):
            ax.bar(x + (k - (len(results) - 1) / 2) * width, counts[k], width, label=r.policy)
        ax.set_xticks(x, instances, rotation=60, ha="right", fontsize="small")
        ax.set_ylabel("model swaps")
        ax.legend(fontsize="small")
    else:
        image = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_yticks(np.arange(len(results)), [r.policy for r in results])
        ax.set_xlabel(f"instance (0..{len(instances) - 1}, sorted by id)")
        fig.colorbar(image, ax=ax, label="model swaps")
    ax.set_title("Model swaps per instance")
    _save(fig, path)


def plot_sweep(
    path: Path, scales: Sequence[float], series: Mapping[str, Sequence[float]], ylabel: str
) -> None:
    """One line per policy (`series`: policy -> a value per scale) against the arrival rate
    scale, on a log axis."""
    fig = _figure()
    ax = fig.add_subplot()
    for policy, ys in series.items():
        ax.plot(scales, ys, marker="o", label=policy)
    ax.set_xscale("log")
    ax.set_xlabel("arrival rate scale")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    _save(fig, path)
