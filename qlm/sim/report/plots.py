"""The PNG plots of a run and of a rate sweep.

Plots use matplotlib's object API (Figure + the Agg canvas), never pyplot's global state, and
PNGs carry no Software metadata. Each function returns the figure it saved. A chart with
nothing to show (no results, no tokens, no waiting requests, no swaps) says so in words on a
zero-based axis instead of drawing an empty or negative one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
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


def _save(fig: Figure, path: Path) -> Figure:
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    return fig


def _say_empty(ax: Axes, message: str) -> None:
    """Write `message` in the middle of an axes that has nothing to show; keep the y axis at
    0..1 (never the negative range matplotlib picks for no data)."""
    ax.text(0.5, 0.5, message, transform=ax.transAxes, ha="center", va="center", color="grey")
    ax.set_ylim(0, 1)


def _legend(ax: Axes, **kwargs: Any) -> None:
    """A legend only when something drawn has a label (an empty legend warns)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def plot_attainment(path: Path, results: Sequence[SimResult]) -> Figure:
    """Grouped bars: SLO attainment overall and per class, one bar per policy; "n/a" where a
    policy had no request of a class, a note when no policy had any request."""
    classes = ["overall", *class_names(results)]
    fig = _figure()
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(results))
    x = np.arange(len(classes))
    for k, r in enumerate(results):
        att = policy_summary(r)["slo_attainment"] if r.num_requests else {}
        at = x + (k - (len(results) - 1) / 2) * width
        values = [att.get(c) for c in classes]
        ax.bar(at, [100.0 * (v or 0.0) for v in values], width, label=r.policy)
        for xi, v in zip(at, values, strict=True):
            if v is None:
                ax.text(xi, 1.0, "n/a", ha="center", va="bottom", fontsize="x-small")
    ax.set_xticks(x, classes)
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title("SLO attainment by class")
    if not any(r.num_requests for r in results):
        _say_empty(ax, "no requests: nothing to attain")
    ax.set_ylim(0, 105)
    _legend(ax, fontsize="small", ncols=max(1, min(4, len(results))))
    return _save(fig, path)


def plot_ttft_cdf(
    path: Path, results: Sequence[SimResult], slo_ttft_s: Mapping[str, float]
) -> Figure:
    """Empirical CDF of time to first token per policy (requests that never produced a token
    keep the curve below 1); dotted lines at each class's TTFT target."""
    fig = _figure()
    ax = fig.add_subplot()
    drawn = False
    for r in results:
        ttfts = np.sort([o.ttft_s for o in r.outcomes if o.ttft_s is not None])
        if len(ttfts) == 0:
            continue
        y = np.arange(1, len(ttfts) + 1) / max(1, r.num_requests)
        ax.step(np.maximum(ttfts, 1e-3), y, where="post", label=r.policy)
        drawn = True
    for name, target in slo_ttft_s.items():
        ax.axvline(target, linestyle=":", color="grey")
        ax.text(target, 0.02, f" {name}", rotation=90, fontsize="x-small", color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s, log scale)")
    ax.set_ylabel("share of requests")
    if not drawn:
        _say_empty(ax, "no request produced a token")
    ax.set_ylim(0, 1.02)
    ax.set_title("TTFT distribution")
    _legend(ax, fontsize="small")
    return _save(fig, path)


def plot_queue(path: Path, results: Sequence[SimResult]) -> Figure:
    """Waiting requests (arrived, no token yet) over time by class, one panel per policy."""
    fig = _figure(8.0, 2.2 * max(1, len(results)) + 0.6)
    axes = fig.subplots(max(1, len(results)), 1, sharex=True, squeeze=False)[:, 0]
    for ax, r in zip(axes, results, strict=False):
        samples = r.queue_samples
        if samples:
            step = max(1, len(samples) // 2000)
            t = np.asarray([s.at_s for s in samples[::step]])
            waiting = np.asarray([s.waiting for s in samples[::step]]).reshape(len(t), -1)
            for k, name in enumerate(r.slo_classes[: waiting.shape[1]]):
                if waiting[:, k].any():
                    ax.plot(t, waiting[:, k], label=name, linewidth=1, drawstyle="steps-post")
        ax.set_ylabel("waiting")
        ax.set_title(r.policy, fontsize="small", loc="left")
        if ax.lines:
            ax.set_ylim(bottom=0)
        else:
            _say_empty(ax, "no request ever waited" if samples else "no queue samples")
        _legend(ax, fontsize="x-small", loc="upper right")
    if not results:
        _say_empty(axes[0], "no results")
    axes[-1].set_xlabel("simulated time (s)")
    return _save(fig, path)


def plot_swaps(path: Path, results: Sequence[SimResult]) -> Figure:
    """Model loads per instance: grouped bars for small fleets, a heat map for large ones."""
    instances = sorted({i for r in results for i in r.swaps})
    fig = _figure(max(8.0, min(20.0, 0.25 * len(instances))), 4.5)
    ax = fig.add_subplot()
    counts = np.asarray([[r.swaps.get(i, 0) for i in instances] for r in results], dtype=float)
    if not instances or not results or not counts.any():
        ax.set_title("Model swaps per instance")
        _say_empty(ax, "no model swaps" if instances and results else "no instances")
        ax.set_xticks([])
        return _save(fig, path)
    if len(instances) <= 24:
        width = 0.8 / max(1, len(results))
        x = np.arange(len(instances))
        for k, r in enumerate(results):
            ax.bar(x + (k - (len(results) - 1) / 2) * width, counts[k], width, label=r.policy)
        ax.set_xticks(x, instances, rotation=60, ha="right", fontsize="small")
        ax.set_ylabel("model swaps")
        ax.set_ylim(bottom=0)
        _legend(ax, fontsize="small")
    else:
        image = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_yticks(np.arange(len(results)), [r.policy for r in results])
        ax.set_xlabel(f"instance (0..{len(instances) - 1}, sorted by id)")
        fig.colorbar(image, ax=ax, label="model swaps")
    ax.set_title("Model swaps per instance")
    return _save(fig, path)


def plot_sweep(
    path: Path, scales: Sequence[float], series: Mapping[str, Sequence[float]], ylabel: str
) -> Figure:
    """One line per policy (`series`: policy -> a value per scale) against the arrival rate
    scale, on a log axis; the y axis starts at 0 (attainment and throughput are never
    negative)."""
    fig = _figure()
    ax = fig.add_subplot()
    for policy, ys in series.items():
        ax.plot(scales, ys, marker="o", label=policy)
    ax.set_xscale("log")
    ax.set_xlabel("arrival rate scale")
    ax.set_ylabel(ylabel)
    values = np.asarray([y for ys in series.values() for y in ys], dtype=float)
    finite = values[np.isfinite(values)]
    if not len(finite):
        _say_empty(ax, "no data")
    elif finite.max() <= 0:
        _say_empty(ax, "every value is 0")
    else:
        ax.set_ylim(0, float(finite.max()) * 1.05)
    _legend(ax, fontsize="small")
    return _save(fig, path)
