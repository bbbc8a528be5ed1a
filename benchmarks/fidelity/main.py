"""The command line and the order of the phases: build and profile the tiny models, then for each
fleet size start the live plane and, run by run, re-measure, run live, simulate and compare;
then plots, the results file and the report."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import fidelity
from benchmarks.fidelity.comparison import compare
from benchmarks.fidelity.docs import write_docs
from benchmarks.fidelity.estimator import check_estimator
from benchmarks.fidelity.host import HostMeter
from benchmarks.fidelity.live import live_run, settle
from benchmarks.fidelity.outcomes import LiveRun
from benchmarks.fidelity.plots import plot_all
from benchmarks.fidelity.profiles import (
    capacity_rps,
    profile_model,
    refit_fleet,
    refit_profile,
    reprofile,
    reprofile_together,
    slowdown,
    trace_lengths,
    with_profiles,
)
from benchmarks.fidelity.results import FidelityReport, Measured, write_results
from benchmarks.fidelity.scenarios import serve_config, write_scenario
from benchmarks.fidelity.settings import (
    ENGINE,
    FULL_RUNS,
    JUST_BEFORE,
    QUICK_RUNS,
    TOGETHER,
    UP_FRONT,
    VLLM_PYTHON,
    Paths,
    RunSpec,
    say,
)
from benchmarks.fidelity.simulated import sim_run
from benchmarks.fidelity.tables import error_table, misses, one_line
from benchmarks.report import code_version
from qlm.clock import WallClock
from qlm.config.profile_files import ProfileFile, load_profile_file
from qlm.engine.profiling.measured import ProfileFit
from qlm.engine.profiling.probes import ProfileGrid
from qlm.serve.runtime import Plane, running_plane
from qlm.sim.scenario import Scenario


@dataclass(frozen=True)
class Setup:
    """What every run shares: where they write, the tiny models (built checkpoints) and their
    up-front profiles, the capacity of one tiny-a instance, the host meter and the workload's
    mean lengths."""

    paths: Paths
    models: Mapping[str, Path]
    profiles: Mapping[str, ProfileFile]
    capacity: float
    meter: HostMeter
    lengths: tuple[float, float]  # the workload's mean prompt and output tokens


async def main_async(args: argparse.Namespace) -> int:
    if not VLLM_PYTHON.exists():
        print(f"no vLLM environment at {VLLM_PYTHON}: run scripts/install_vllm.sh", file=sys.stderr)
        return 2
    from tests.vllm_fixtures import build_tiny_models

    runs = QUICK_RUNS if args.quick else FULL_RUNS
    if args.runs:
        runs = tuple(r for r in FULL_RUNS if r.name in args.runs)
    code = code_version()  # before the measurement: others may commit while it runs
    paths = Paths.of(args)
    meter = HostMeter(WallClock())
    stop_meter = asyncio.Event()
    meter_task = asyncio.create_task(meter.run(stop_meter))
    paths.folder.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="qlm-fidelity-"))
    built = build_tiny_models(workdir / "models", VLLM_PYTHON)
    meter.mark("build tiny models")
    need = ["tiny-a"] + (["tiny-b"] if any(r.swap for r in runs) else [])
    models = {m: built[m] for m in need}
    fits, setup = await _profile(paths, models, bool(args.quick), meter)
    measured = Measured()
    for n_instances in sorted({r.instances for r in runs}):
        group = [r for r in runs if r.instances == n_instances]
        group.sort(key=lambda r: r.swap)  # the swap run last: it leaves an instance on tiny-b
        await _run_fleet(setup, group, measured)
    meter.mark("stop planes, simulate")
    stop_meter.set()
    await meter_task
    report = FidelityReport(
        paths, bool(args.quick), runs, setup.capacity, fits, measured, meter.samples, code
    )
    return _write(report)


async def _profile(
    paths: Paths, models: Mapping[str, Path], quick: bool, meter: HostMeter
) -> tuple[dict[str, tuple[ProfileFile, ProfileFit]], Setup]:
    """Profile each model up front (profile files next to the report); the capacity one tiny-a
    instance sustains by its fitted profile at the workload's mean lengths."""
    # tiny-a serves every run: the default grid; tiny-b only the swap run: the small grid
    grids = {
        "tiny-a": ProfileGrid.quick() if quick else ProfileGrid(repeats=2),
        "tiny-b": ProfileGrid.quick().model_copy(update={"repeats": 2}),
    }
    mean_out, std_out, typical = trace_lengths()
    fits: dict[str, tuple[ProfileFile, ProfileFit]] = {}
    for name in models:
        say(f"profiling {name}")
        loads = 1 if name == "tiny-a" else 2
        workload = (mean_out, std_out, typical)
        fits[name] = await profile_model(paths, models, name, grids[name], workload, loads)
        meter.mark(f"profile {name}")
    profiles = {m: load_profile_file(paths.profile(m)) for m in models}
    prompt_mean = typical - mean_out / 2
    capacity = capacity_rps(profiles["tiny-a"].to_profile(), prompt_mean, mean_out)
    say(f"fitted capacity of one tiny-a instance: {capacity:.2f} requests/s")
    return fits, Setup(paths, models, profiles, capacity, meter, (prompt_mean, mean_out))


async def _run_fleet(setup: Setup, group: Sequence[RunSpec], measured: Measured) -> None:
    """One live plane for the runs of one fleet size, run after run."""
    need = list(setup.models)
    first = group[0]
    scenario0 = write_scenario(setup.paths, first, 1.0, need)
    config = serve_config(first, setup.profiles, setup.models, scenario0.config)
    n_instances = first.instances
    say(f"starting the live plane with {n_instances} vLLM instance(s)")
    async with running_plane(config, api=False) as plane:
        setup.meter.mark(f"start plane ({n_instances} instances)")
        for run in group:
            await _run_one(setup, plane, run, measured)
            await settle(plane)


async def _run_one(setup: Setup, plane: Plane, run: RunSpec, measured: Measured) -> None:
    """Re-measure tiny-a (on the first engine alone, then on every engine at once), run the
    workload live, simulate it on the up-front and on each re-measured step model, compare
    them, and check the estimator."""
    meter = setup.meter
    rate = run.load * setup.capacity * run.instances
    scenario = write_scenario(setup.paths, run, rate, list(setup.models))
    requests = scenario.requests()
    refit = await reprofile(plane, setup.models, "tiny-a")
    meter.mark(f"re-profile before {run.name}")
    together = await reprofile_together(plane, setup.models, "tiny-a")
    if together is not None:
        meter.mark(f"re-profile together before {run.name}")
    say(f"run {run.name}: {len(requests)} requests at {rate:.2f}/s")
    live = await live_run(plane, run, requests, scenario.config)
    meter.mark(f"live {run.name}")
    sim = sim_run(scenario, live.requests, live)
    measured.comparisons.append(compare(run.name, live, sim, UP_FRONT))
    say(one_line(measured.comparisons[-1]))
    again = None
    if refit is not None:
        measured.refits[run.name] = refit
        fleet = refit_fleet(scenario.fleet(), setup.profiles["tiny-a"], refit)
        again = sim_run(scenario, live.requests, live, fleet)
        measured.comparisons.append(compare(run.name, live, again, JUST_BEFORE))
        say(one_line(measured.comparisons[-1]))
    if together is not None:
        _simulate_together(setup, run, scenario, live, together, measured)
    measured.results[run.name] = (live, sim, again)
    measured.checks.append(check_estimator(run.name, live))


def _simulate_together(
    setup: Setup,
    run: RunSpec,
    scenario: Scenario,
    live: LiveRun,
    fit: ProfileFit,
    measured: Measured,
) -> None:
    """The run simulated on the step model measured with every engine busy: tiny-a's fit,
    and every other model slowed by the factor that fit shows against tiny-a's profile file
    (`Profile.slowed`; left as profiled should the fit come out faster)."""
    tiny_a = setup.profiles["tiny-a"]
    factor = slowdown(tiny_a, fit, *setup.lengths)
    others = [
        spec.to_profile().slowed(max(1.0, factor))
        for m, spec in setup.profiles.items()
        if m != "tiny-a"
    ]
    fleet = with_profiles(scenario.fleet(), [refit_profile(tiny_a, fit), *others])
    result = sim_run(scenario, live.requests, live, fleet)
    measured.together_fits[run.name] = fit
    measured.together[run.name] = result
    measured.comparisons.append(compare(run.name, live, result, TOGETHER))
    say(one_line(measured.comparisons[-1]) + f" (host slowdown x{factor:.2f})")


def _write(report: FidelityReport) -> int:
    """The plots, the results file and the report; the error table and misses on stdout."""
    measured = report.measured
    fit_only = {m: f for m, (_, f) in report.fits.items()}
    figures = plot_all(report.paths, measured.results, fit_only, measured.checks)
    write_results(report)
    write_docs(report, figures)
    print("\n".join(error_table(measured.comparisons)))
    for line in misses(measured.comparisons):
        print("miss:", line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(fidelity.__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one model, one short run")
    parser.add_argument(
        "--docs",
        type=Path,
        help="the report to write; its plots, profiles and scenarios go to the folder of the "
        "same name (default docs/fidelity.md; with --quick, under benchmarks/results/)",
    )
    parser.add_argument(
        "--cpu-nice",
        type=int,
        default=ENGINE["cpu_nice"],
        help="niceness of the vLLM servers (engine.vllm.cpu_nice), profiling included: above "
        "0 the control plane's process goes first when both are runnable (default %(default)s)",
    )
    parser.add_argument(
        "--runs",
        nargs="+",
        choices=[r.name for r in FULL_RUNS],
        help="only these of the full runs (the report then holds only them)",
    )
    args = parser.parse_args(argv)
    ENGINE["cpu_nice"] = args.cpu_nice  # one setting for profiles, re-profiles and live runs
    return asyncio.run(main_async(args))
