"""Fixtures for tests that run a real vLLM engine on this machine's CPU (marker `vllm`).

The vLLM environment lives in .venv-vllm (scripts/install_vllm.sh); without it these fixtures
skip the test with the reason. Two tiny random-weight Llamas stand in for two models:

    tiny-a  hidden 128, 2 heads (head_dim 64), 2 layers, seed 1   ~1 KiB of KV per token
    tiny-b  hidden 256, 4 heads (head_dim 64), 2 layers, seed 2   ~2 KiB of KV per token

Use from another test module (or a conftest.py):

    from tests.vllm_fixtures import tiny_models, vllm_python  # noqa: F401  (pytest fixtures)

    @pytest.mark.vllm
    async def test_something(tiny_models: dict[str, Path]) -> None:
        config = tiny_engine_config(tiny_models)
        async with VllmEngine(make_instance("i0", loaded_model="tiny-a"), config, WallClock()):
            ...

`vllm_harness` is an EngineHarness factory for the EngineClient contract suite
(tests/engine/harness.py: ENGINE_FACTORIES["vllm"] = vllm_harness, ENGINE_MARKS["vllm"] =
[pytest.mark.vllm, pytest.mark.slow]); each use starts a server (about 30-60 s here).
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from qlm.clock import WallClock
from qlm.config.vllm_config import VllmEngineConfig
from qlm.engine.vllm.vllm_engine import VllmEngine
from qlm.types import Instance

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
TINY_MODELS: Mapping[str, Mapping[str, int]] = {
    "tiny-a": {"seed": 1, "hidden-size": 128, "num-heads": 2},
    "tiny-b": {"seed": 2, "hidden-size": 256, "num-heads": 4},
}
BUILD_TIMEOUT_S = 600


def vllm_python_or_skip() -> Path:
    """The vLLM environment's interpreter; skips the calling test when it is missing."""
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON}: run scripts/install_vllm.sh")
    return VLLM_PYTHON


def build_tiny_models(
    out_dir: Path,
    python: Path,
    specs: Mapping[str, Mapping[str, int]] = TINY_MODELS,
    *,
    reuse: bool = False,
) -> dict[str, Path]:
    """Build every model of `specs` (name -> qlm.engine.tiny_models options; default
    TINY_MODELS) under out_dir with the vLLM environment's python; with `reuse`, a model
    already built there is kept."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    paths: dict[str, Path] = {}
    for name, spec in specs.items():
        path = out_dir / name
        paths[name] = path
        if reuse and (path / "model.safetensors").exists():
            continue
        args = [f"--{key}={value}" for key, value in spec.items()]
        subprocess.run(
            [str(python), "-m", "qlm.engine.tiny_models", str(path), *args],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
            timeout=BUILD_TIMEOUT_S,
        )
    return paths


# vLLM's engine core in the server's own process: by default (V1 multiprocessing) a CPU
# engine is a server, an engine core and a worker process that poll each other's shared
# memory; with two engines on this 2-core machine those polls starved the control plane for
# seconds (an interactive chat of tests/serve/test_vllm_plane.py waited 12.8 s in one CI run).
ONE_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def tiny_engine_config(models: Mapping[str, Path], **overrides: Any) -> VllmEngineConfig:
    """A small CPU engine in one process: 8 sequences, 4096-token context, 64 MiB of KV
    cache."""
    overrides["env"] = ONE_PROCESS | overrides.get("env", {})
    fields: dict[str, Any] = {
        "python": VLLM_PYTHON,
        "models": dict(models),
        "max_num_seqs": 8,
        "max_model_len": 4096,
        "kv_cache_gib": 1 / 16,
        "dtype": "bfloat16",
        "ignore_eos": True,  # random weights: exact output lengths for the assertions
    }
    return VllmEngineConfig(**(fields | overrides))


def tiny_instance(instance_id: str = "vllm-0", model: str | None = "tiny-a") -> Instance:
    return Instance(instance_id, "cpu", 1, 1 << 30, model)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    return vllm_python_or_skip()


@pytest.fixture(scope="session")
def tiny_models(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"tiny-a": folder, "tiny-b": folder}, built once per test session."""
    return build_tiny_models(tmp_path_factory.mktemp("tiny-models"), vllm_python)


@functools.cache
def _shared_tiny_models() -> dict[str, Path]:
    """Tiny models for harness factories, which run outside the fixture system."""
    return build_tiny_models(Path(tempfile.mkdtemp(prefix="qlm-tiny-models-")), VLLM_PYTHON)


@asynccontextmanager
async def vllm_harness(kv_swap: bool = True) -> AsyncIterator[Any]:
    """A started VllmEngine in a LiveHarness (kv_swap is ignored: vLLM cannot swap)."""
    from tests.engine.harness import LiveHarness

    vllm_python_or_skip()
    models = _shared_tiny_models()
    engine = VllmEngine(tiny_instance(), tiny_engine_config(models), WallClock())
    await engine.start()
    try:
        yield LiveHarness(engine, ("tiny-a", "tiny-b"), speedup=1.0)
    finally:
        await engine.close()
