"""How much CPU each part used: a process's CPU seconds and run-queue wait, and the whole
machine's busy time, from /proc; a meter over one measured interval."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a live process; 0 when it is gone.

    The scheduler's nanosecond count of each live thread's time on a CPU (/proc/PID/task/
    TID/schedstat): /proc/PID/stat's user and system times tick at 1/CLK_TCK (10 ms), as
    coarse as a whole run's ~0.2 s of qlm CPU divided by 20. A thread that ended since the
    previous reading takes its time with it (the plane's threads live as long as it does);
    /proc/PID/stat's figure is the fallback where schedstat is missing."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        tasks = []
    if tasks:
        return sum(map(_thread_cpu_ns, tasks)) / 1e9
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _thread_cpu_ns(task: Path) -> int:
    """One thread's nanoseconds on a CPU; 0 for a thread that ended since it was listed."""
    try:
        return int((task / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def runqueue_wait_s(pid: int) -> float:
    """Seconds the process's main thread (an event loop) has waited for a CPU while
    runnable (/proc/PID/schedstat); 0 when unavailable."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def process_syscalls(pid: int) -> int:
    """Read and write system calls the process has made (/proc/PID/io syscr + syscw; 0 when
    unreadable): the round trips it paid to Redis, vLLM and its clients, a count that the
    machine's load does not blur the way it blurs CPU seconds."""
    try:
        lines = Path(f"/proc/{pid}/io").read_text().splitlines()
    except OSError:
        return 0
    counts = dict(line.split(": ", 1) for line in lines if ": " in line)
    return int(counts.get("syscr", 0)) + int(counts.get("syscw", 0))


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every core, every user)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / CLOCK_TICKS


class CpuMeter:
    """CPU used by each named process, the load generator and the whole machine, in cores
    (CPU seconds per wall second) over the measured interval."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.start_wall = time.monotonic()
        self.start_machine = machine_busy_s()
        self.start = {name: process_cpu_s(pid) for name, pid in self.pids.items()}

    def stop(self, client_cpu_s: float, accepted: int) -> dict[str, float]:
        """Cores used per part, and CPU microseconds per accepted request."""
        wall = time.monotonic() - self.start_wall
        used = {name: process_cpu_s(pid) - self.start[name] for name, pid in self.pids.items()}
        parts = {
            "api": sum(v for k, v in used.items() if k.startswith(("api:", "serve:"))),
            "controller_agents": sum(
                v for k, v in used.items() if k.startswith(("controller:", "agent:"))
            ),
            "redis": used["redis"],
            "clients": client_cpu_s,
        }
        machine = machine_busy_s() - self.start_machine
        parts["others"] = max(0.0, machine - sum(parts.values()))
        cores = {f"cpu_{name}_cores": v / wall for name, v in parts.items()}
        per_request = {
            f"cpu_{name}_us_per_req": 1e6 * parts[name] / max(1, accepted)
            for name in ("api", "controller_agents", "redis", "clients")
        }
        return {**cores, "cpu_machine_cores": machine / wall, **per_request}
