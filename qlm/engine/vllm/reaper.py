"""Runs a command (a vLLM server) as its child and takes the whole process group down with it.

Question answered: how does nothing of a server outlive its agent, when the agent dies by
SIGKILL and the server's own shutdown hangs? The agent starts this script as the session
leader of the server's process group, with the parent-death signal set (process.py): when the
agent dies, Linux sends this script SIGTERM. It then sends SIGTERM to every process under
it (API server, engine core, workers; it is their subreaper, so orphans and those that left
the group count too), waits up to the grace period, and SIGKILLs what is left. It does the
same when the server exits on its own (a crash can leave the engine core behind), and ends
as the server did (its exit code, or the signal that killed it), so the agent's watcher
reports the server's end.

Standard library only: it is run by path (`python reaper.py GRACE_S ARGV...`), not imported.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

POLL_S = 0.1
REAP_EVERY = 50  # polls between collecting orphans that ended (5 s)
PR_SET_CHILD_SUBREAPER = 36

# A process as pid and start time (clock ticks after boot): a pid the kernel hands out again
# to another process during the take-down is not that process.
Proc = tuple[int, int]


def _processes() -> dict[int, tuple[int, int, bool]]:
    """Every process but this one: pid -> (parent pid, start time, zombie)."""
    me = os.getpid()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 19:
            zombie = fields[0] == b"Z"
            found[int(name)] = (int(fields[1]), int(fields[19]), zombie)
    return found


def live() -> dict[Proc, int]:
    """Live (not zombie) processes but this one: (pid, start) -> parent pid."""
    return {(pid, start): ppid for pid, (ppid, start, z) in _processes().items() if not z}


def descendants() -> set[Proc]:
    """This process's live descendants: its whole process group, and also those that left
    it (setsid); orphans among them stay its children (it is their subreaper)."""
    procs = live()
    children: dict[int, list[Proc]] = {}
    for proc, ppid in procs.items():
        children.setdefault(ppid, []).append(proc)
    found: set[Proc] = set()
    todo = list(children.get(os.getpid(), []))
    while todo:
        proc = todo.pop()
        found.add(proc)
        todo.extend(children.get(proc[0], []))
    return found


def signal_all(procs: set[Proc], sig: signal.Signals) -> None:
    for pid, _ in procs & set(live()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def take_down(child: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM every descendant (the process group, and those that left it), wait up to
    `grace_s` for them to end, SIGKILL the rest."""
    targets = descendants()
    signal_all(targets, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        child.poll()  # reap the server, so it no longer counts
        reap_orphans(child.pid)
        targets = (targets | descendants()) & set(live())
        if not targets:
            return
        time.sleep(POLL_S)
    signal_all(targets | descendants(), signal.SIGKILL)
    child.wait()


def reap_orphans(server_pid: int) -> None:
    """Collect this process's ended children other than the server (orphans it adopted)."""
    me = os.getpid()
    for pid, (ppid, _, zombie) in _processes().items():
        if zombie and ppid == me and pid != server_pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def become_subreaper() -> None:
    """Orphans among the server's descendants become this process's children, not init's,
    so they are still found (and taken down) after their parent ended. Linux only."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: reaper.py GRACE_S COMMAND [ARG...]", file=sys.stderr)
        return 2
    grace_s, command = float(argv[0]), argv[1:]
    stop: list[int] = []

    def _request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _request_stop)
    if os.getpgid(0) != os.getpid():  # lead a group of its own: never signal the caller's
        os.setpgid(0, 0)
    become_subreaper()
    child = subprocess.Popen(command)  # same group, same output, same CPU affinity
    polls = 0
    while child.poll() is None and not stop:
        time.sleep(POLL_S)
        polls += 1
        if polls % REAP_EVERY == 0:
            reap_orphans(child.pid)
    take_down(child, grace_s)
    code = child.wait()  # reaped here if it exited during the take-down
    if code < 0 and not stop:  # the server died of a signal: so does this process
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
