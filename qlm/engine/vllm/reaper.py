"""Runs a command (a vLLM server) as its child and takes the whole process group down with it.

Question answered: how does nothing of a server outlive its agent, when the agent dies by
SIGKILL and the server's own shutdown hangs? The agent starts this script as the session
leader of the server's process group, with the parent-death signal set (process.py): when the
agent dies, Linux sends this script SIGTERM. It then sends SIGTERM to every other process in
its group (API server, engine core, workers), waits up to the grace period, and SIGKILLs
what is left. It does the same when the server exits on its own (a crash can leave the
engine core behind), and ends as the server did (its exit code, or the signal that killed
it), so the agent's watcher reports the server's end.

Standard library only: it is run by path (`python reaper.py GRACE_S ARGV...`), not imported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from types import FrameType

POLL_S = 0.1


def _processes() -> dict[int, tuple[int, int]]:
    """Every live (not zombie) process but this one: pid -> (parent pid, process group)."""
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
        if len(fields) > 2 and fields[0] != b"Z":
            found[int(name)] = (int(fields[1]), int(fields[2]))
    return found


def group_members(pgid: int) -> list[int]:
    """Pids of live processes in process group `pgid`, this one left out."""
    return [pid for pid, (_, group) in _processes().items() if group == pgid]


def descendants() -> list[int]:
    """Pids of this process's live descendants, also those that left its group (setsid)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in _processes().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def signal_all(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def take_down(child: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the group and every descendant (one that left the group included), wait up
    to `grace_s` for them to end, SIGKILL the rest."""
    pgid = os.getpgid(0)
    targets = set(descendants()) | set(group_members(pgid))
    signal_all(targets, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        child.poll()  # reap the server, so it no longer counts
        targets = (targets | set(group_members(pgid))) & set(_processes())
        if not targets:
            return
        time.sleep(POLL_S)
    signal_all(targets | set(group_members(pgid)) | set(descendants()), signal.SIGKILL)
    child.wait()


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
    child = subprocess.Popen(command)  # same group, same output, same CPU affinity
    while child.poll() is None and not stop:
        time.sleep(POLL_S)
    take_down(child, grace_s)
    code = child.wait()  # reaped here if it exited during the take-down
    if code < 0 and not stop:  # the server died of a signal: so does this process
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
