"""How busy was the host in each phase? CPU use of the whole host (everyone's work) and of this
benchmark's process tree (its vLLM servers included), load average and CPU pressure."""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from qlm.clock import Clock


@dataclass
class HostSample:
    """CPU use of the whole host and of this benchmark's process tree over one phase."""

    phase: str
    wall_s: float
    host_cpu_busy: float  # share of all cores busy (everyone's work)
    own_cpu_cores: float  # cores used by this process and its children (vLLM servers)
    load_average: tuple[float, float, float]
    cpu_pressure: float | None  # share of time some task waited for a CPU (PSI avg60)


def cpu_pressure() -> float | None:
    """Linux pressure stall information: /proc/pressure/cpu `some avg60` as a share."""
    try:
        text = Path("/proc/pressure/cpu").read_text()
    except OSError:
        return None
    for part in text.split():
        if part.startswith("avg60="):
            return float(part.partition("=")[2]) / 100.0
    return None


class HostMeter:
    """CPU use per phase. The process tree is sampled every second (`run`), so the vLLM
    servers' CPU counts even after they exit within a phase."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.samples: list[HostSample] = []
        self._me = psutil.Process()
        self._seen: dict[int, float] = {}  # pid -> CPU seconds at its latest sample
        self.sample()
        self._start()

    def sample(self) -> None:
        for proc in [self._me, *self._me.children(recursive=True)]:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            self._seen[proc.pid] = t.user + t.system

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    def _start(self) -> None:
        self._t0 = self.clock.monotonic_s()
        self._cpu0 = psutil.cpu_times()
        self._base = dict(self._seen)

    def mark(self, phase: str) -> HostSample:
        self.sample()
        wall = max(1e-9, self.clock.monotonic_s() - self._t0)
        busy = _busy_share(self._cpu0, psutil.cpu_times())
        own_s = sum(cpu - self._base.get(pid, 0.0) for pid, cpu in self._seen.items())
        sample = HostSample(phase, wall, busy, own_s / wall, os.getloadavg(), cpu_pressure())
        self.samples.append(sample)
        self._start()
        return sample


def _busy_share(a: Any, b: Any) -> float:
    total = sum(b) - sum(a)
    idle = (b.idle + getattr(b, "iowait", 0.0)) - (a.idle + getattr(a, "iowait", 0.0))
    return 0.0 if total <= 0 else 1.0 - idle / total
