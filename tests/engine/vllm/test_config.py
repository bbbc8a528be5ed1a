"""How a vLLM server is run (qlm/config/vllm_config.py): its command line and its settings."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from qlm.clock import WallClock
from qlm.config.vllm_config import SERVE_MODULE, VllmEngineConfig, serve_argv
from qlm.engine.engine_types import EngineError
from qlm.engine.vllm.vllm_engine import VllmEngine
from tests.engine.vllm.helpers import config
from tests.vllm_fixtures import tiny_instance


def test_the_command_line_carries_the_cpu_settings() -> None:
    argv = serve_argv(
        config(max_model_len=1024, kv_cache_gib=1 / 64, extra_args=("--x",)), "tiny-b", 8123
    )
    assert argv[:3] == [".venv-vllm/bin/python", "-m", SERVE_MODULE]
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--model"] == "/m/b"
    assert pairs["--served-model-name"] == "tiny-b"
    assert pairs["--port"] == "8123"
    assert pairs["--max-model-len"] == "1024"
    assert pairs["--max-num-seqs"] == "16"
    assert pairs["--kv-cache-memory-bytes"] == str(16 * 1024 * 1024)
    assert "--enforce-eager" in argv
    assert argv[-1] == "--x"
    assert pairs["--scheduling-policy"] == "priority"  # deadline scheduling, the default
    no_kv = serve_argv(
        config(kv_cache_gib=None, enforce_eager=False, scheduling="fcfs"), "tiny-a", 1
    )
    assert "--kv-cache-memory-bytes" not in no_kv
    assert "--enforce-eager" not in no_kv
    assert "--scheduling-policy" not in no_kv


def test_the_agent_closes_idle_connections_before_the_server_does() -> None:
    """Pooled connections to a server live half its keep-alive: vLLM's default 5 s, or the
    one the engine's env sets for the server."""
    assert config().client_keepalive_s() == 2.5
    assert config(env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "2"}).client_keepalive_s() == 1.0
    for bad in ("soon", "0"):
        with pytest.raises(ValueError, match=r"env\.VLLM_HTTP_TIMEOUT_KEEP_ALIVE"):
            config(env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": bad})


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="synthetic_token_ids"):
        config(synthetic_token_ids=(5, 5))
    with pytest.raises(ValueError, match="Extra inputs"):
        config(gpus=1)
    with pytest.raises(ValueError, match="models"):
        VllmEngineConfig(models={})
    with pytest.raises(ValueError, match="not in the engine's models"):
        VllmEngine(tiny_instance(model="tiny-z"), config(), WallClock())


def test_cpu_cores_are_validated() -> None:
    for bad in ((), (0, 0), (-1,)):
        with pytest.raises(ValueError, match="cpu_cores"):
            config(cpu_cores=bad)


async def test_the_server_runs_on_its_cores_with_its_threads_bound_there(tmp_path: Path) -> None:
    """The server as the agent launches it (a stand-in interpreter that reports where it runs
    and exits): its process affinity and vLLM's OpenMP binding are the configured cores; the
    fleet file's own env still wins over the binding."""
    core = max(os.sched_getaffinity(0))
    report = tmp_path / "where.txt"
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        f"grep Cpus_allowed_list /proc/self/status > {report}\n"
        f'echo "bind=$VLLM_CPU_OMP_THREADS_BIND keep=$KEEP" >> {report}\n'
        "exit 3\n"
    )
    fake.chmod(0o755)
    engine = VllmEngine(
        tiny_instance(),
        config(python=fake, log_dir=tmp_path, cpu_cores=(core,), env={"KEEP": "1"}),
        WallClock(),
    )
    with pytest.raises(EngineError, match="code 3"):
        await engine.start()
    await engine.close()
    allowed, bound = report.read_text().splitlines()
    assert allowed.split()[-1] == str(core)
    assert bound == f"bind={core} keep=1"
    unbound = config(cpu_cores=None).server_env()
    assert "VLLM_CPU_OMP_THREADS_BIND" not in unbound
    overridden = config(cpu_cores=(1, 0), env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"})
    assert overridden.server_env()["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


async def test_the_server_runs_at_its_niceness_above_the_agent(tmp_path: Path) -> None:
    """`cpu_nice` lowers the server's CPU priority by that much against the agent's (a
    stand-in interpreter reports its niceness and exits); 0 leaves it at the agent's."""
    base = os.nice(0)
    for nice in (0, 7):
        report = tmp_path / f"nice-{nice}.txt"
        fake = tmp_path / f"python-{nice}"
        fake.write_text(f"#!/bin/sh\nnice > {report}\nexit 3\n")
        fake.chmod(0o755)
        settings = config(python=fake, log_dir=tmp_path, cpu_nice=nice)
        engine = VllmEngine(tiny_instance(), settings, WallClock())
        with pytest.raises(EngineError, match="code 3"):
            await engine.start()
        await engine.close()
        assert int(report.read_text()) == min(base + nice, 19)
    with pytest.raises(ValueError, match="cpu_nice"):
        config(cpu_nice=20)
