"""Where the qlm process's CPU goes, by hop: py-spy samples its threads during each QLM run,
each sample is given to the hop its stack belongs to, and the run's measured CPU (from
/proc) is split in proportion.

Hops (`hop_of`, the first rule a stack matches):
  queue            any frame in qlm/queue/ (enqueue, pulls, stream writes and reads), whoever
                   called it
  token streaming  under the SSE response (qlm/api/streaming.py's SseResponse): the relay of
                   a stream's events to the client, the socket writes included
  admission        the rest of the HTTP server's work: parsing, routing, validation, admission
                   and the wait estimate
  control loop     the controller (grouping, planning, publishing the plan)
  agent            the per-instance agents (plan heads, reconcile, engine events to queue
                   writes)
  engine client    the vLLM adapter: submitting, reading vLLM's token streams, scraping its
                   metrics
  other            any other Python frame (logging, GC callbacks, timers)
A sample whose stack ends in the event loop itself (uvloop's C code, no Python frame above
`Runner.run`) or in a thread pool's wait is not counted: py-spy cannot tell uvloop's
epoll_wait from work, so that C-level time (epoll, socket reads outside Python frames) is
spread over the hops in proportion with the rest. The shares are statistical: a run of
~300 ms of qlm CPU at 250 samples/s gives ~75 samples; pooled over a variant's runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common.stats import median

RATE_PER_S = 250
# With this set to a folder, each run's raw py-spy stacks are kept there (for a flame graph:
# where inside a hop the time goes)
KEEP_STACKS = "QLM_BENCH_KEEP_STACKS"
HOPS = (
    "queue",
    "token streaming",
    "admission",
    "control loop",
    "agent",
    "engine client",
    "other",
)
# (hop, markers): a stack belongs to the first hop any of whose markers a frame contains.
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("queue", ("(qlm/queue/",)),
    ("token streaming", ("SseResponse.__call__ ",)),
    ("admission", ("(qlm/api/", "(uvicorn/", "(starlette/", "(fastapi/")),
    ("control loop", ("ControlLoop.", "(qlm/control/")),
    # the live agent and everything it runs (its lease keeper included: that task counted as
    # "other" in results measured before the agent moved out of qlm/serve/, e6f05f9 and earlier)
    ("agent", ("(qlm/agents/",)),
    ("engine client", ("(qlm/engine/", "(aiohttp/")),
)
# A stack that ends in one of these is an idle thread: py-spy's idle detection does not know
# uvloop, whose wait (epoll) is C code right under `Runner.run`, nor a pool's queue wait.
IDLE_LEAVES = ("Runner.run (", "_worker (concurrent/")
IDLE_FILES = ("(threading.py:",)


def hop_of(stack: Sequence[str]) -> str | None:
    """The hop of a sampled stack (frames outermost first, as py-spy writes them), or None
    for an idle thread."""
    task = _task_frames(stack)
    for hop, markers in RULES:
        if any(marker in frame for frame in task for marker in markers):
            return hop
    if stack and (stack[-1].startswith(IDLE_LEAVES) or any(f in stack[-1] for f in IDLE_FILES)):
        return None
    return "other"


def _task_frames(stack: Sequence[str]) -> Sequence[str]:
    """The frames of the task or callback the event loop was running (those above the
    loop's `Runner.run`); the whole stack for another thread."""
    for index in range(len(stack) - 1, -1, -1):
        if stack[index].startswith(IDLE_LEAVES[0]):
            return stack[index + 1 :]
    return stack


def hop_counts(raw_lines: Iterable[str]) -> Counter[str]:
    """Samples per hop from py-spy's raw (collapsed-stack) output: `f1;f2;...;fn COUNT`."""
    counts: Counter[str] = Counter()
    for line in raw_lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        hop = hop_of(stack.split(";"))
        if hop is not None:
            counts[hop] += int(count)
    return counts


class HopSampler:
    """py-spy recording one set of processes for the length of a `with` block; `counts`
    afterwards (empty when py-spy is missing or could not attach)."""

    def __init__(self, pids: Sequence[int]) -> None:
        self._pids = tuple(pids)
        self._procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self._dir = Path(tempfile.mkdtemp(prefix="qlm-hops-"))
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []  # what py-spy said when it wrote nothing

    def __enter__(self) -> HopSampler:
        spy = py_spy()
        for pid in self._pids if spy else ():
            out = self._dir / f"{pid}.txt"
            argv = [spy, "record", "--pid", str(pid), "--rate", str(RATE_PER_S)]
            argv += ["--format", "raw", "--nonblocking", "--output", str(out)]
            popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self._procs.append((popen, out))
        return self

    def __exit__(self, *exc: object) -> None:
        for popen, out in self._procs:
            popen.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                _, err = popen.communicate(timeout=30.0)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
                continue
            if out.exists():
                self.counts += hop_counts(out.read_text().splitlines())
                if keep := os.environ.get(KEEP_STACKS):
                    Path(keep).mkdir(parents=True, exist_ok=True)
                    shutil.copy(out, Path(keep) / f"{time.time_ns()}-{out.name}")
            elif err:
                self.errors.append(err.decode(errors="replace").strip()[-200:])
                print(f"    py-spy: {self.errors[-1]}", file=sys.stderr)
        shutil.rmtree(self._dir, ignore_errors=True)


def py_spy() -> str | None:
    """The py-spy binary beside this interpreter, else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def hop_rows(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per QLM variant and workload: the median CPU ms per request, and each hop's share of
    the pooled samples and its part of that CPU."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for run in runs:
        if run.get("ok") and run.get("hop_samples"):
            groups.setdefault((run["variant"], run["workload"]), []).append(run)
    rows: list[dict[str, Any]] = []
    for (variant, workload), group in groups.items():
        pooled: Counter[str] = Counter()
        for run in group:
            pooled.update(run["hop_samples"])
        total = sum(pooled.values())
        cpu = median([r["qlm_cpu_ms_per_req"] for r in group])
        row: dict[str, Any] = {"variant": variant, "workload": workload, "samples": total}
        row["qlm_cpu_ms_per_req"] = cpu
        for hop in HOPS:
            row[hop] = None if cpu is None or not total else cpu * pooled[hop] / total
        rows.append(row)
    return rows
