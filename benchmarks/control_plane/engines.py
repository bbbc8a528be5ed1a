"""The engines the overhead benchmark drives: a bare vLLM-CPU server started exactly as QLM's
VllmEngine starts it, and `qlm serve` with one vLLM engine of the same settings in front."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common.plane import Proc, descendants, example_fleet, start_qlm, stop, wait_http
from benchmarks.report import ROOT
from tests.redis_server import free_port


def ensure_tiny_model(cache_dir: Path) -> Path:
    """tiny-a (tests/vllm_fixtures.py's spec), built once into cache_dir with .venv-vllm."""
    from tests.vllm_fixtures import TINY_MODELS, VLLM_PYTHON

    path = cache_dir / "tiny-a"
    if (path / "qlm_tiny_model.json").exists() and (path / "model.safetensors").exists():
        return path
    args = [f"--{key}={value}" for key, value in TINY_MODELS["tiny-a"].items()]
    subprocess.run(
        [str(VLLM_PYTHON), "-m", "qlm.engine.tiny_models", str(path), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        check=True,
        capture_output=True,
        timeout=600,
    )
    return path


Cores = tuple[int, ...]


def split_cores(vllm_cores: Cores | None) -> tuple[Cores | None, Cores]:
    """(the vLLM server's cores, everyone else's): by default the last core for vLLM and the
    rest for QLM and the load generator, so the comparison measures QLM, not two programs
    fighting for the same cores; on one core there is nothing to split."""
    mine = tuple(sorted(os.sched_getaffinity(0)))
    if vllm_cores is None:
        if len(mine) < 2:
            return None, mine
        vllm_cores = mine[-1:]
    rest = tuple(c for c in mine if c not in vllm_cores)
    return vllm_cores, rest or mine


def engine_settings(model_path: Path, cpu_cores: tuple[int, ...] | None) -> Any:
    from tests.vllm_fixtures import tiny_engine_config

    return tiny_engine_config(
        {"tiny-a": model_path}, max_num_seqs=16, max_model_len=2048, cpu_cores=cpu_cores
    )


def start_bare_vllm(engine: Any, log_dir: Path) -> Proc:
    from qlm.config.vllm_config import serve_argv

    port = free_port()
    log_path = log_dir / f"bare-vllm-{port}.log"
    env = {**os.environ, **engine.server_env()}  # as VllmEngine starts it, cores included
    cores = engine.cpu_cores
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            serve_argv(engine, "tiny-a", port),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, cores),
        )
    proc = Proc("vllm", popen, log_path, port)
    try:
        wait_http(proc, "/health", 600.0)
    except Exception:
        stop_group(proc)
        raise
    return proc


def plane_config(
    engine: Any, redis_url: str | None, path: Path, agent: Mapping[str, Any] | None = None
) -> Path:
    """examples/fleet.yaml's QLM, controller and agent settings (`agent` overrides some of
    the latter); one vLLM instance."""
    fleet = example_fleet()
    data = {
        "qlm": fleet["qlm"],
        "queue": {"url": redis_url, "key_prefix": "bench:"},
        "api": {"host": "127.0.0.1", "port": 0},
        "controller": fleet.get("controller", {}),
        "agent": {**fleet["agent"], **(agent or {})},
        "engine": {"kind": "vllm", "vllm": engine.model_dump(mode="json")},
        "models": [{"name": "tiny-a", "max_context_tokens": engine.max_model_len}],
        "fleet": {
            "gpu_types": {"cpu": {"memory_gib": 1.0}},
            "packaged_profiles": False,
            "instances": [{"id": "cpu", "gpu_type": "cpu", "model": "tiny-a"}],
            "profiles": [
                {
                    "model": "tiny-a",
                    "gpu_type": "cpu",
                    "weight_bytes": 10737418,  # 0.01 GiB
                    "kv_bytes_per_token": 1024,
                    "decode_table": {"batch_sizes": [1, 16], "step_s": [0.008, 0.02]},
                    "prefill_tokens_per_s": 20_000,
                    "output_tokens_mean": 32,
                    "output_tokens_std": 1,
                    "load_s": 30,
                    "max_batch_size": engine.max_num_seqs,
                }
            ],
        },
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start_plane(config: Path, log_dir: Path) -> Proc:
    proc = start_qlm(["serve"], config, log_dir, free_port())
    try:
        wait_http(proc, "/readyz", 900.0)  # the API starts after the engine is up
    except Exception:
        stop(proc, grace_s=60.0)
        raise
    return proc


def stop_group(proc: Proc, grace_s: float = 20.0) -> None:
    """Stop a session leader and its whole process group (a vLLM server and its workers)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(wait_s)
            break
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def find_vllm_server(qlm_pid: int) -> tuple[int, int]:
    """(pid, port) of the vLLM server that a `qlm serve` process started."""
    from qlm.config.vllm_config import SERVE_MODULE

    for pid in descendants(qlm_pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            if argv[1:3] == ["-m", SERVE_MODULE] and "--port" in argv:  # not its reaper
                return pid, int(argv[argv.index("--port") + 1])
    raise RuntimeError(f"no vLLM server among the processes of qlm serve ({qlm_pid})")


STEPS_METRIC = "vllm:iteration_tokens_total"  # a histogram: one observation per engine step


def engine_steps(metrics_text: str) -> float | None:
    """Engine steps a vLLM server has run so far (its iteration histogram's count, summed
    over engines), from its /metrics text; None when the server does not export it."""
    from qlm.engine.vllm.metrics import histogram_totals

    if STEPS_METRIC not in metrics_text:
        return None
    return histogram_totals(metrics_text, (STEPS_METRIC,))[STEPS_METRIC].count
