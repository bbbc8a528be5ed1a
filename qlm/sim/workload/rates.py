"""How does an arrival rate change over time, and when is the expected n-th arrival?

`RateProfile` is a piecewise-linear rate built from a base rate, an optional linear ramp and
bursts. Its integral L(t) (`cumulative`) and the inverse L^-1 (`inverse`) implement the
time-change method: a unit-rate renewal process in "operational time" y maps to t = L^-1(y).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RateProfile:
    """A piecewise-linear rate: segment i runs from starts_s[i] to starts_s[i+1] (the last one
    forever), with rate moving linearly from rate_from[i] to rate_to[i] (equal in the last)."""

    starts_s: tuple[float, ...]
    rate_from: tuple[float, ...]
    rate_to: tuple[float, ...]

    @classmethod
    def build(
        cls,
        rate_per_s: float,
        ramp: tuple[float, float, float] | None = None,
        bursts: Sequence[tuple[float, float, float]] = (),
    ) -> RateProfile:
        """rate_per_s, with an optional ramp (start_s, end_s, to_rate_per_s) and bursts
        (start_s, end_s, factor); overlapping bursts multiply."""
        points = {0.0}
        if ramp is not None:
            points |= {ramp[0], ramp[1]}
        for start, end, _ in bursts:
            points |= {start, end}
        starts = sorted(points)

        def base(t: float) -> float:
            if ramp is None or t <= ramp[0]:
                return rate_per_s
            if t >= ramp[1]:
                return ramp[2]
            return rate_per_s + (ramp[2] - rate_per_s) * (t - ramp[0]) / (ramp[1] - ramp[0])

        def factor(t: float) -> float:
            return math.prod(k for s, e, k in bursts if s <= t < e)

        rate_from: list[float] = []
        rate_to: list[float] = []
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else start  # the last is constant
            k = factor(start)
            rate_from.append(base(start) * k)
            rate_to.append(base(end) * k)
        return cls(tuple(starts), tuple(rate_from), tuple(rate_to))

    def rate_at(self, t_s: float) -> float:
        i = max(0, bisect.bisect_right(self.starts_s, t_s) - 1)
        if i + 1 >= len(self.starts_s):
            return self.rate_from[i]
        frac = (t_s - self.starts_s[i]) / (self.starts_s[i + 1] - self.starts_s[i])
        return self.rate_from[i] + (self.rate_to[i] - self.rate_from[i]) * frac

    def _cumulative_at_starts(self) -> list[float]:
        out = [0.0]
        for i in range(len(self.starts_s) - 1):
            length = self.starts_s[i + 1] - self.starts_s[i]
            out.append(out[-1] + 0.5 * (self.rate_from[i] + self.rate_to[i]) * length)
        return out

    def cumulative(self, t_s: float) -> float:
        """Expected arrivals in [0, t_s]."""
        cum = self._cumulative_at_starts()
        i = max(0, bisect.bisect_right(self.starts_s, t_s) - 1)
        x = t_s - self.starts_s[i]
        r0 = self.rate_from[i]
        slope = 0.0
        if i + 1 < len(self.starts_s):
            slope = (self.rate_to[i] - r0) / (self.starts_s[i + 1] - self.starts_s[i])
        return cum[i] + r0 * x + 0.5 * slope * x * x

    def inverse(self, y: FloatArray) -> FloatArray:
        """Times t with cumulative(t) = y (y non-decreasing); inf where the rate has dropped
        to zero for good before reaching y."""
        cum = np.asarray(self._cumulative_at_starts())
        seg = np.maximum(0, np.searchsorted(cum, y, side="left") - 1)
        out = np.empty_like(y)
        starts = np.asarray(self.starts_s)
        last = len(self.starts_s) - 1
        for i in np.unique(seg):
            mask = seg == i
            dy = y[mask] - cum[i]
            r0 = self.rate_from[i]
            if i == last:
                out[mask] = starts[i] + (dy / r0 if r0 > 0 else np.where(dy > 0, np.inf, 0.0))
                continue
            length = starts[i + 1] - starts[i]
            half_slope = (self.rate_to[i] - r0) / (2.0 * length)
            # r0 x + half_slope x^2 = dy, solved in the cancellation-free form
            root = np.sqrt(np.maximum(0.0, r0 * r0 + 4.0 * half_slope * dy))
            with np.errstate(divide="ignore", invalid="ignore"):
                x = np.where(r0 + root > 0, 2.0 * dy / (r0 + root), 0.0)
            out[mask] = starts[i] + np.minimum(x, length)
        return out
