"""Every policy on every scenario, in parallel worker processes with a wall-time limit per run,
or as tasks on a Ray cluster (`--ray ADDRESS`: qlm/sim/spread.py; no time limit there); and the
load calibration (fcfs alone over a grid of rate scales). A run is the same simulation either
way (`run_policy`), so the results are too."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from benchmarks.report import ROOT
from qlm.sim.report import policy_summary
from qlm.sim.result import SimResult
from qlm.sim.scenario import Scenario, load_scenario
from qlm.sim.spread import LocalRunner, PolicyRun, Runner, run_policy

SIMS = ROOT / "sims"


SCENARIOS = ("wa", "wb", "wc")


CALIBRATION_GRID = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
CALIBRATION_BAR = 0.75  # fcfs overall attainment below this selects the load


def scenario_path(name: str, quick: bool) -> Path:
    return SIMS / (f"{name}-quick.yaml" if quick else f"{name}.yaml")


def policy_run(path: str, policy: str, seed: int | None, rate_scale: float | None) -> PolicyRun:
    """The simulation of one task: the scenario at its rate scale, at `seed` (default its own)."""
    scenario = load_scenario(Path(path))
    if rate_scale is not None:
        scenario = scenario.model_copy(update={"rate_scale": rate_scale})
    return PolicyRun(scenario, policy, scenario.seed if seed is None else seed)


def summarize(result: SimResult) -> dict[str, Any]:
    """A run's summary plus run figures."""
    return {
        **policy_summary(result),
        "sim_wall_s": result.sim_wall_s,  # no longer in policy_summary (summary.json)
        "events": result.events_processed,
        "events_per_s": result.events_per_s,
        "planner_wall_s": result.planner_wall_s,
        "end_s": result.end_s,
    }


def run_one(
    path: str,
    policy: str,
    seed: int | None,
    rate_scale: float | None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """One policy on one scenario (in a worker process); the summary plus run figures."""
    return summarize(run_policy(policy_run(path, policy, seed, rate_scale), progress))


def describe(scenario: Scenario, path: Path) -> dict[str, Any]:
    fleet = scenario.fleet()
    return {
        "file": str(path.relative_to(ROOT)),
        "requests": sum(1 for _ in scenario.iter_requests()),
        "instances": len(fleet.instances),
        "gpus": sum(i.gpu_count for i in fleet.instances),
        "fleet": scenario.fleet_counts(),
        "rate_scale": scenario.rate_scale,
        "seed": scenario.seed,
    }


@dataclass
class Task:
    key: tuple[str, str]  # (scenario name, policy or rate label)
    path: str
    policy: str
    rate_scale: float | None = None
    seed: int | None = None  # this task's seed, over the one run_tasks is given

    def seed_or(self, seed: int | None) -> int | None:
        return seed if self.seed is None else self.seed


@dataclass
class _Running:
    task: Task
    process: BaseProcess
    conn: Connection
    started_s: float
    ended: Any  # a shared int: requests ended so far (multiprocessing.Value)


def _worker(conn: Connection, task: Task, seed: int | None, ended: Any) -> None:
    def progress(done: int, total: int) -> None:
        ended.value = done

    conn.send(run_one(task.path, task.policy, task.seed_or(seed), task.rate_scale, progress))
    conn.close()


def run_tasks(
    tasks: Sequence[Task],
    seed: int | None,
    jobs: int,
    limit_s: float | None,
    runner: Runner | None = None,
) -> Iterator[tuple[Task, dict[str, Any], float]]:
    """Run tasks in up to `jobs` processes; yield (task, summary, wall seconds) as each ends.
    A run past limit_s is stopped; its summary is then {"stopped_after_s", "ended"}. With a
    Ray `runner`, every task at once on the cluster instead (no limit; the wall seconds are
    the simulation's own)."""
    if runner is not None and not isinstance(runner, LocalRunner):
        if limit_s is not None:
            raise ValueError("--max-run-s is not supported with --ray")
        runs = [policy_run(t.path, t.policy, t.seed_or(seed), t.rate_scale) for t in tasks]
        for task, result in zip(tasks, runner.map(run_policy, runs), strict=True):
            yield task, summarize(result), result.sim_wall_s
        return
    pending = list(tasks)
    running: list[_Running] = []
    context = multiprocessing.get_context("fork")
    while pending or running:
        while pending and len(running) < jobs:
            task = pending.pop(0)
            receive, send = context.Pipe(duplex=False)
            ended = context.Value("q", 0)
            process = context.Process(target=_worker, args=(send, task, seed, ended))
            process.start()
            send.close()
            running.append(_Running(task, process, receive, time.perf_counter(), ended))
        time.sleep(0.2)
        for run in list(running):
            waited_s = time.perf_counter() - run.started_s
            if run.conn.poll():
                summary = run.conn.recv()
                run.process.join()
                running.remove(run)
                yield run.task, summary, waited_s
            elif not run.process.is_alive():
                running.remove(run)
                raise RuntimeError(f"{run.task.key} failed (exit {run.process.exitcode})")
            elif limit_s is not None and waited_s > limit_s:
                run.process.kill()
                run.process.join()
                running.remove(run)
                yield run.task, {"stopped_after_s": waited_s, "ended": run.ended.value}, waited_s


def run_matrix(
    names: Sequence[str],
    policies: Sequence[str],
    quick: bool,
    seed: int | None,
    jobs: int,
    limit_s: float | None,
    runner: Runner | None = None,
) -> dict[str, Any]:
    scenarios: dict[str, Any] = {}
    tasks = []
    for name in names:
        path = scenario_path(name, quick)
        scenario = load_scenario(path)
        scenarios[scenario.name] = {**describe(scenario, path), "policies": {}, "timeouts": {}}
        tasks += [Task((scenario.name, p), str(path), p) for p in policies]
    for task, summary, waited_s in run_tasks(tasks, seed, jobs, limit_s, runner):
        name, policy = task.key
        if "stopped_after_s" in summary:
            stopped = {"after_s": round(waited_s), "ended": summary["ended"]}
            scenarios[name]["timeouts"][policy] = stopped
            print(
                f"  {name:<9} {policy:<13} stopped after {waited_s:.0f} s with "
                f"{summary['ended']} of {scenarios[name]['requests']} requests ended",
                flush=True,
            )
            continue
        scenarios[name]["policies"][policy] = summary
        print(
            f"  {name:<9} {policy:<13} attainment {summary['slo_attainment']['overall']:6.1%}  "
            f"throughput {summary['throughput_rps']:8.2f} rps  "
            f"wall {summary['sim_wall_s']:7.1f} s",
            flush=True,
        )
    return scenarios


def calibrate(
    names: Sequence[str], quick: bool, seed: int | None, jobs: int, runner: Runner | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        path = scenario_path(name, quick)
        scenario = load_scenario(path)
        tasks = [Task((scenario.name, f"x{g:g}"), str(path), "fcfs", g) for g in CALIBRATION_GRID]
        found = {t.rate_scale: s for t, s, _ in run_tasks(tasks, seed, jobs, None, runner)}
        points = [
            {"rate_scale": g, "fcfs_attainment": found[g]["slo_attainment"]["overall"]}
            for g in CALIBRATION_GRID
        ]
        chosen = next(
            (p["rate_scale"] for p in points if p["fcfs_attainment"] < CALIBRATION_BAR), None
        )
        out[scenario.name] = {"points": points, "chosen": chosen, "shipped": scenario.rate_scale}
        cells = ", ".join(f"x{p['rate_scale']:g}: {p['fcfs_attainment']:.1%}" for p in points)
        print(f"  {scenario.name}: fcfs {cells}; chosen x{chosen}, file x{scenario.rate_scale:g}")
    return out
