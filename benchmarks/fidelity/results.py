"""What one benchmark run measured, in one place: the results file (benchmarks/results/
fidelity.json, or beside a --docs report) with every per-request time, and the command that
reproduces the run."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.fidelity.comparison import Comparison, Triple
from benchmarks.fidelity.estimator import EstimatorCheck
from benchmarks.fidelity.host import HostSample
from benchmarks.fidelity.outcomes import LiveRun
from benchmarks.fidelity.settings import Paths, RunSpec
from benchmarks.fidelity.simulated import sim_outcomes
from benchmarks.report import command_line, json_safe
from qlm.config.profile_files import ProfileFile
from qlm.engine.profiling.measured import ProfileFit
from qlm.sim.result import SimResult


@dataclass
class Measured:
    """What the live runs and their simulations gave, run by run."""

    results: dict[str, Triple] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)
    checks: list[EstimatorCheck] = field(default_factory=list)
    refits: dict[str, ProfileFit] = field(default_factory=dict)  # run -> re-measured tiny-a
    # run -> tiny-a re-measured with every engine busy, and the run simulated on it
    together_fits: dict[str, ProfileFit] = field(default_factory=dict)
    together: dict[str, SimResult] = field(default_factory=dict)


@dataclass(frozen=True)
class FidelityReport:
    """Everything one benchmark run measured: what the results file, the plots and
    docs/fidelity.md are written from."""

    paths: Paths
    quick: bool
    runs: Sequence[RunSpec]
    capacity: float  # requests/s one tiny-a instance sustains by its fitted profile
    fits: Mapping[str, tuple[ProfileFile, ProfileFit]]  # model -> up-front profile and fit
    measured: Measured
    host: Sequence[HostSample]
    code: str = "unknown"  # the commit measured (benchmarks.report.code_version)


def command(quick: bool) -> str:
    """The command line the report names (the docs path aside)."""
    return command_line("fidelity.py", ["--quick"] if quick else [])


def write_results(report: FidelityReport) -> None:
    """Strict JSON (NaN, a percentile of nothing, as null), every per-request time included."""
    measured = report.measured
    data = {
        "command": command(report.quick),
        "code": report.code,
        "quick": report.quick,
        "capacity_rps_per_instance": report.capacity,
        "runs": [asdict(r) | {"models": dict(r.models)} for r in report.runs],
        "fits": {m: f.quality().model_dump() for m, (_, f) in report.fits.items()},
        "step_models": {
            "up_front": {m: asdict(f.fit.step_time) for m, (_, f) in report.fits.items()},
            "just_before": {run: asdict(f.fit.step_time) for run, f in measured.refits.items()},
            "together": {run: asdict(f.fit.step_time) for run, f in measured.together_fits.items()},
        },
        "comparisons": [asdict(c) for c in measured.comparisons],
        "estimator": [
            {k: v for k, v in asdict(c).items() if k != "pairs"} for c in measured.checks
        ],
        "host": [asdict(s) for s in report.host],
        "requests": {
            name: _requests(*triple, measured.together.get(name))
            for name, triple in measured.results.items()
        },
    }
    path = report.paths.results
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json_safe(data), indent=1, default=str, allow_nan=False)
    path.write_text(text + "\n")


def _requests(
    live: LiveRun, sim: SimResult, again: SimResult | None, together: SimResult | None
) -> dict[str, Any]:
    return {
        "live": [asdict(o) for o in live.outcomes],
        "live_swap_events": [list(e) for e in live.swap_events],
        "sim": [asdict(o) for o in sim_outcomes(sim)],
        "sim_just_before": None if again is None else [asdict(o) for o in sim_outcomes(again)],
        "sim_together": None if together is None else [asdict(o) for o in sim_outcomes(together)],
    }
