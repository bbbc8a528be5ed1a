"""Fitting the step-time model to measured iteration times.

Question answered: which StepTime (qlm/perf/step.py) explains measured iterations best?
`fit_step_time` takes measured iterations (batch composition -> seconds) and returns the
non-negative least-squares StepTime that minimises the relative error, with its residuals.
`splitwise_samples` turns rows of the Splitwise performance table (prompt time and time per
output token by prompt size and batch size) into such samples. `qlm profile` fits
measurements of a live engine the same way (measured.py).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls

from qlm.perf.step import StepTime


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured iteration (or the mean of identical ones)."""

    prefill_tokens: float
    decode_seqs: float
    context_tokens: float
    iteration_s: float
    label: str = ""


@dataclass(frozen=True, slots=True)
class StepTimeFit:
    """A fitted StepTime and how well it explains its samples: relative errors (what the fit
    minimises) and R^2 of the absolute times (the share of their variance it explains)."""

    step_time: StepTime
    samples: int
    rms_relative_error: float
    max_relative_error: float
    r_squared: float = float("nan")

    def predicted_s(self, sample: StepSample) -> float:
        return self.step_time.iteration_s(
            sample.prefill_tokens, sample.decode_seqs, sample.context_tokens
        )


def fit_step_time(samples: Sequence[StepSample]) -> StepTimeFit:
    """Non-negative least squares on relative error (each row divided by its measurement)."""
    if len(samples) < 4:
        raise ValueError("fitting four coefficients needs at least four samples")
    x = np.array(
        [[1.0, s.prefill_tokens, s.decode_seqs, s.context_tokens] for s in samples], dtype=float
    )
    y = np.array([s.iteration_s for s in samples], dtype=float)
    if np.any(y <= 0):
        raise ValueError("measured iteration times must be > 0")
    coef, _ = nnls(x / y[:, None], np.ones_like(y))
    step = StepTime(float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]))
    predicted = x @ coef
    rel = (predicted - y) / y
    return StepTimeFit(
        step_time=step,
        samples=len(samples),
        rms_relative_error=float(np.sqrt(np.mean(rel**2))),
        max_relative_error=float(np.max(np.abs(rel))),
        r_squared=r_squared(y, predicted),
    )


def r_squared(measured: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    """1 - residual sum of squares / total sum of squares (1: perfect; 0: no better than the
    mean; NaN when every measurement is the same)."""
    y = np.asarray(measured, dtype=float)
    residual = float(np.sum((y - np.asarray(predicted, dtype=float)) ** 2))
    total = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - residual / total if total > 0 else float("nan")


def splitwise_samples(
    rows: Iterable[Mapping[str, str]],
    model: str,
    hardware: str,
    tensor_parallel: int,
    max_prefill_tokens: int = 4096,
) -> list[StepSample]:
    """Median prompt and token times of one (model, hardware, TP) in the Splitwise table.

    A prompt row (batch b of prompts of p tokens) is one iteration that prefills b*p tokens
    with b*p tokens of context; rows above max_prefill_tokens are left out (chunked prefill
    never runs larger iterations). A token row is a decode step of b sequences whose context
    averages p + token_size / 2 tokens over the generation.
    """
    prompt: dict[tuple[int, int], list[float]] = defaultdict(list)
    token: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for row in rows:
        if (row["model"], row["hardware"], int(row["tensor_parallel"])) != (
            model,
            hardware,
            tensor_parallel,
        ):
            continue
        p, b, t = int(row["prompt_size"]), int(row["batch_size"]), int(row["token_size"])
        prompt[(p, b)].append(float(row["prompt_time"]) / 1000.0)
        token[(p, b, t)].append(float(row["token_time"]) / 1000.0)
    samples = [
        StepSample(b * p, 0, b * p, statistics.median(v), f"prefill {b}x{p}")
        for (p, b), v in sorted(prompt.items())
        if b * p <= max_prefill_tokens
    ]
    samples += [
        StepSample(0, b, b * (p + t / 2.0), statistics.median(v), f"decode b={b} p={p} t={t}")
        for (p, b, t), v in sorted(token.items())
    ]
    return samples
