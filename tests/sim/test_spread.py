"""Independent simulations run here or on a Ray cluster with the same results (qlm/sim/spread.py):
`qlm simulate --ray ADDRESS` against a local Ray head this test starts, file for file against
the same command without it."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from qlm.config import ConfigError
from qlm.sim.scenario import load_scenario
from qlm.sim.spread import RAY_ENV, LocalRunner, PolicyRun, make_runner, run_policy
from tests.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "sims" / "wa-quick.yaml"
RAY = Path(sys.executable).with_name("ray")


def test_without_an_address_runs_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RAY_ENV, raising=False)
    runner = make_runner(None)
    assert isinstance(runner, LocalRunner)
    assert runner.map(lambda x: x * 2, [3, 1, 2]) == [6, 2, 4]  # the jobs' order


def test_ray_absent_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if not installed
    with pytest.raises(ConfigError, match=r"--ray 10\.0\.0\.1:6379: Ray is not installed"):
        make_runner("10.0.0.1:6379")


def test_a_result_survives_the_trip_to_a_worker_and_back() -> None:
    """What a Ray worker sends back is pickled: the result, read-only maps included."""
    scenario = load_scenario(SCENARIO)
    result = run_policy(PolicyRun(scenario, "fcfs", 1))
    back = pickle.loads(pickle.dumps(result))
    assert back == result
    assert back.outcomes == result.outcomes
    with pytest.raises(TypeError):
        back.swaps["x"] = 1  # type: ignore[index]  # read-only again


@pytest.fixture
def ray_head(tmp_path: Path) -> Iterator[str]:
    """A Ray head on this machine, two CPUs, stopped after the test."""
    if not RAY.exists():
        pytest.skip("Ray is not installed (pip install 'qlm[ray]')")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != RAY_ENV}
    start = [str(RAY), "start", "--head", f"--port={port}", "--num-cpus=2"]
    start += ["--include-dashboard=false", "--disable-usage-stats"]
    subprocess.run(start, check=True, capture_output=True, env=env, timeout=120)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(RAY), "stop", "--force"], capture_output=True, env=env, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_sweep_on_ray_writes_what_it_writes_here(ray_head: str, tmp_path: Path) -> None:
    def simulate(out: Path, *more: str) -> None:
        command = [sys.executable, "-m", "qlm.cli", "simulate", str(SCENARIO), "--no-progress"]
        command += ["--policy", "fcfs", "--policy", "edf", "--sweep", "rate=0.5,1"]
        env = {k: v for k, v in os.environ.items() if k != RAY_ENV}
        done = subprocess.run(
            [*command, "--out", str(out), *more], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    simulate(tmp_path / "here")
    simulate(tmp_path / "ray", "--ray", ray_head)
    for folder in ("rate-0.5", "rate-1"):
        here = (tmp_path / "here" / folder / "requests.csv").read_text()
        there = (tmp_path / "ray" / folder / "requests.csv").read_text()
        assert here == there, folder
        assert here.count("\n") > 1000  # both policies' requests
    shutil.rmtree(tmp_path / "ray")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_capacity_search_on_ray_finds_what_it_finds_here(ray_head: str, tmp_path: Path) -> None:
    """On Ray each column's fleets are simulated at once; the search still evaluates (and
    reports) exactly the fleets it evaluates here, so the documents are the same."""

    def capacity(out: Path, *more: str) -> dict[str, object]:
        command = [sys.executable, "-m", "qlm.cli", "capacity", str(SCENARIO), "--policy"]
        command += ["fcfs", "--target", "0.95", "--max-count", "3", "--out", str(out)]
        env = {k: v for k, v in os.environ.items() if k != RAY_ENV}
        done = subprocess.run([*command, *more], capture_output=True, text=True, env=env)
        assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
        loaded: dict[str, object] = json.loads(out.read_text())
        return loaded

    here = capacity(tmp_path / "here.json")
    there = capacity(tmp_path / "ray.json", "--ray", ray_head)
    assert there == here
    assert len(here["evaluated"]) >= 3  # type: ignore[arg-type]  # a search, not one fleet
