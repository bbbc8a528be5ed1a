"""The reaper at the head of a vLLM server's process group (qlm/engine/vllm/reaper.py), with
plain processes in place of vLLM: a grandchild that ignores SIGTERM stands for an engine core
whose shutdown hangs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qlm.engine.vllm.process import REAPER, reaped

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc and PR_SET_PDEATHSIG")

GRACE_S = 1.0
# A server that starts a stubborn child (SIGTERM ignored), passes on the child's pid once it
# ignores SIGTERM, and waits.
STUBBORN_SERVER = (
    "import subprocess, sys, time;"
    "c = subprocess.Popen([sys.executable, '-c', "
    "'import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    " print(os.getpid(), flush=True); time.sleep(600)'], stdout=subprocess.PIPE);"
    "print(c.stdout.readline().decode().strip(), flush=True); time.sleep(600)"
)
# An agent that starts the server under the reaper, as process.py does, then waits.
AGENT = (
    "import functools, os, subprocess, sys, time;"
    "from qlm.engine.vllm.process import _in_child, reaped;"
    "p = subprocess.Popen(reaped([sys.executable, '-c', sys.argv[1]], float(sys.argv[2])),"
    " start_new_session=True, preexec_fn=functools.partial(_in_child, os.getpid(), None));"
    "time.sleep(600)"
)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_dead(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def group_of(pgid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == pgid and alive(int(name)):
                    pids.append(int(name))
            except ProcessLookupError:
                pass
    return pids


def test_the_group_dies_with_its_agent_even_when_a_member_ignores_sigterm() -> None:
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, STUBBORN_SERVER, str(GRACE_S)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[3],
    )
    try:
        assert agent.stdout is not None
        stubborn = int(agent.stdout.readline())
        pgid = os.getpgid(stubborn)
        members = group_of(pgid)
        assert len(members) == 3  # reaper, server, its stubborn child
        agent.kill()  # SIGKILL: no cleanup of its own
        agent.wait()
        assert wait_dead(members, GRACE_S + 10.0) == []
    finally:
        agent.kill()


def test_a_descendant_that_left_the_group_dies_with_the_agent_too() -> None:
    """A server's child in a session of its own (setsid) is not in the group; the reaper
    finds it by parentage."""
    server = STUBBORN_SERVER.replace(
        "stdout=subprocess.PIPE)", "stdout=subprocess.PIPE, start_new_session=True)"
    )
    assert server != STUBBORN_SERVER
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, server, str(GRACE_S)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[3],
    )
    stubborn: int | None = None
    try:
        assert agent.stdout is not None
        stubborn = int(agent.stdout.readline())
        assert os.getpgid(stubborn) == stubborn  # it leads a group of its own
        agent.kill()
        agent.wait()
        assert wait_dead([stubborn], GRACE_S + 10.0) == []
    finally:
        agent.kill()
        if stubborn is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stubborn, signal.SIGKILL)


def test_sigterm_to_the_group_ends_a_stubborn_member_after_the_grace() -> None:
    proc = subprocess.Popen(
        reaped([sys.executable, "-c", STUBBORN_SERVER], GRACE_S),
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    stubborn = int(proc.stdout.readline())
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=GRACE_S + 10.0)
    assert wait_dead([stubborn], 5.0) == []
    assert time.monotonic() - started >= GRACE_S * 0.9  # it waited before SIGKILL


def test_a_server_that_exits_takes_its_children_along_and_its_code_is_kept() -> None:
    server = STUBBORN_SERVER.replace(
        "strip(), flush=True); time.sleep(600)", "strip(), flush=True); sys.exit(3)"
    )
    proc = subprocess.Popen(reaped([sys.executable, "-c", server], GRACE_S), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    stubborn = int(proc.stdout.readline())
    assert proc.wait(timeout=GRACE_S + 10.0) == 3
    assert wait_dead([stubborn], 5.0) == []


def test_an_orphan_in_a_session_of_its_own_dies_when_the_server_exits() -> None:
    """The server exits and leaves a setsid child behind: an orphan, adopted by the reaper
    (its subreaper) rather than init, so the take-down still finds it."""
    server = STUBBORN_SERVER.replace(
        "stdout=subprocess.PIPE)", "stdout=subprocess.PIPE, start_new_session=True)"
    ).replace("strip(), flush=True); time.sleep(600)", "strip(), flush=True); sys.exit(3)")
    proc = subprocess.Popen(reaped([sys.executable, "-c", server], GRACE_S), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    stubborn = int(proc.stdout.readline())
    try:
        assert os.getpgid(stubborn) == stubborn
        assert proc.wait(timeout=GRACE_S + 10.0) == 3
        assert wait_dead([stubborn], 5.0) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stubborn, signal.SIGKILL)


def test_a_server_killed_by_a_signal_shows_as_killed_by_it() -> None:
    proc = subprocess.Popen(
        reaped([sys.executable, "-c", "import time; print(1, flush=True); time.sleep(600)"], 1.0),
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    os.kill(int(children[0]), signal.SIGKILL)
    assert proc.wait(timeout=10.0) == -signal.SIGKILL


def test_a_reaper_started_inside_a_group_leads_its_own() -> None:
    proc = subprocess.Popen(
        reaped([sys.executable, "-c", STUBBORN_SERVER], GRACE_S), stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    stubborn = int(proc.stdout.readline())
    assert os.getpgid(stubborn) == proc.pid != os.getpgid(0)
    proc.terminate()  # the reaper alone: it takes its group down, not this one
    proc.wait(timeout=GRACE_S + 10.0)
    assert wait_dead([stubborn], 5.0) == []


def test_the_reaper_is_run_by_path() -> None:
    assert REAPER.is_file()
    assert reaped(["x"], 2.5)[1:] == [str(REAPER), "2.5", "x"]
