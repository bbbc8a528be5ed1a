"""The control plane as real processes, as a benchmark runs it: start a `qlm` part (api,
controller, agent, serve) from this checkout on a config derived from examples/fleet.yaml, wait
until it answers over HTTP, stop it and whatever it started, and find the pids a benchmark
measures (a process's descendants, redis-server's)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.report import ROOT

FLEET_PATH = ROOT / "examples" / "fleet.yaml"
QLM_MAIN = "import sys; from qlm.cli import main; sys.exit(main())"


def example_fleet() -> dict[str, Any]:
    """examples/fleet.yaml (an emulated mixed fleet of 4 instances) as a dict to adapt."""
    data: dict[str, Any] = yaml.safe_load(FLEET_PATH.read_text())
    return data


def instance_ids(config: Path) -> list[str]:
    """The ids of the instances a fleet file declares (what `qlm agent --instance` takes)."""
    from qlm.config.serve_config import ServeConfig

    data = yaml.safe_load(config.read_text())
    return [i.id for i in ServeConfig.model_validate(data).instance_list()]


@dataclass
class Proc:
    """A server process a benchmark started (a `qlm` part or a vLLM server)."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    port: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, num_lines: int = 8, sep: str = " | ") -> str:
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
            return sep.join(lines[-num_lines:])
        return ""


def start_qlm(args: Sequence[str], config: Path, log_dir: Path, port: int | None = None) -> Proc:
    """`qlm ARGS --config CONFIG [--port PORT]` from this checkout, logging to log_dir; the
    process is named after its command (args[0])."""
    argv = [sys.executable, "-c", QLM_MAIN, *args, "--config", str(config)]
    if port is not None:
        argv += ["--port", str(port)]
    log_path = log_dir / f"{args[0]}-{port or 'x'}-{time.monotonic_ns()}.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log_path.open("wb") as log:
        popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return Proc(args[0], popen, log_path, port)


def wait_http(proc: Proc, path: str, timeout_s: float) -> None:
    """Poll http://127.0.0.1:PORT/PATH until it answers 200; RuntimeError if the process
    exits or the time is up."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise RuntimeError(
                    f"{proc.name} exited ({proc.popen.returncode}): {proc.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"http://127.0.0.1:{proc.port}{path}").status_code == 200:
                    return
            time.sleep(0.1)
    raise RuntimeError(f"{proc.name} not ready after {timeout_s:.0f} s: {proc.log_tail()}")


def stop(proc: Proc, grace_s: float = 30.0) -> None:
    """SIGINT (qlm shuts down its engines on it), then SIGTERM, then SIGKILL; afterwards, kill
    any process this one started that outlived it (by pid and process group)."""
    children = descendants(proc.pid)
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if proc.popen.poll() is not None:
            break
        proc.popen.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(wait_s)
    for pid in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def stop_all(procs: Sequence[Proc], grace_s: float = 20.0) -> None:
    """SIGINT to every process at once (the parts of a plane shut down side by side), then
    SIGKILL for any still running after grace_s."""
    for proc in procs:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait()


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (found through /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = (entry / "stat").read_text()
            ppid = int(text[text.rfind(")") + 2 :].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def redis_pid(url: str) -> int:
    """The pid of the redis-server at url (to measure its CPU or memory)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        info: dict[str, Any] = client.info("server")
        return int(info["process_id"])
    finally:
        client.close()
