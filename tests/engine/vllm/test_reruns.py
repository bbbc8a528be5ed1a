"""What the vLLM engine does so that a request can run again (after an eviction, or after its
agent was killed) without its client noticing: sampling seeded by the request id, and a server
process that dies with the agent that started it. No vLLM needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from qlm.config.vllm_config import VllmEngineConfig
from qlm.engine.vllm.protocol import request_body
from qlm.types import Request
from tests.factories import make_request

ROOT = Path(__file__).resolve().parents[3]


def config(**overrides: object) -> VllmEngineConfig:
    fields: dict[str, object] = {"models": {"tiny-a": Path("/m/a")}}
    return VllmEngineConfig.model_validate(fields | overrides)


def request(request_id: str) -> Request:
    return replace(make_request(id=request_id), prompt="hi")


def completion_body(request: Request, max_tokens: int, engine: VllmEngineConfig) -> dict[str, Any]:
    return request_body(request, max_tokens, engine)[1]


def test_a_request_is_seeded_by_its_id_so_a_rerun_samples_the_same_text() -> None:
    seeded = config(seed_requests=True)
    first = completion_body(request("r1"), 8, seeded)
    assert first["seed"] == completion_body(request("r1"), 8, seeded)["seed"]
    assert first["seed"] != completion_body(request("r2"), 8, seeded)["seed"]
    chosen = replace(request("r1"), sampling={"seed": 7})
    assert completion_body(chosen, 8, seeded)["seed"] == 7  # the client's seed wins
    assert "seed" not in completion_body(request("r1"), 8, config())  # off by default


PARENT = textwrap.dedent(
    """
    import functools, os, subprocess, sys, time
    from qlm.engine.vllm.process import _die_with_parent
    child = subprocess.Popen(
        ["sleep", "60"],
        start_new_session=True,  # as the server: its own group, out of reach of killpg
        preexec_fn=functools.partial(_die_with_parent, os.getpid()),
    )
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_process_dies_when_its_agent_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert psutil.pid_exists(child_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10.0
        while psutil.pid_exists(child_pid) and time.monotonic() < deadline:
            try:
                if psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE:
                    break  # dead, waiting for init to reap it
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        alive = psutil.pid_exists(child_pid) and (
            psutil.Process(child_pid).status() != psutil.STATUS_ZOMBIE
        )
        assert not alive, "the server outlived its agent"
    finally:
        if parent.poll() is None:
            parent.kill()
