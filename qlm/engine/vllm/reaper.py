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


def group_members(pgid: int) -> list[int]:
    """Pids of live (not zombie) processes in process group `pgid`, this one left out."""
    me = os.getpid()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            pids.append(int(name))
    return pids


def signal_group(pgid: int, sig: signal.Signals) -> None:
    for pid in group_members(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def take_down(child: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the group, wait up to `grace_s` for it to empty, SIGKILL the rest."""
    pgid = os.getpgid(0)
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        child.poll()  # reap the server, so it no longer counts
        if not group_members(pgid):
            return
        time.sleep(POLL_S)
    signal_group(pgid, signal.SIGKILL)
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
