"""Layer rules: the policy core imports no I/O library (DESIGN.md: functional core, I/O at the
edges), and only qlm/clock.py reads time."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "qlm"
# Network and server libraries, and what ties code to real time or processes: event loops,
# threads, subprocesses and the time module (the core takes a Clock instead).
IO_LIBRARIES = {
    "redis",
    "fastapi",
    "uvicorn",
    "httpx",
    "requests",
    "aiohttp",
    "socket",
    "vllm",
    "kubernetes",
    "asyncio",
    "threading",
    "subprocess",
    "time",
}
CORE = [
    "types.py",
    "config",
    "registry.py",
    "perf",
    "grouping",
    "estimator",
    "solver",
    "agents",
    "control",
    "autoscale/need.py",
    "autoscale/replicas.py",
    "autoscale/demand.py",
    "engine",
    "queue",
    "sim/events.py",
    "sim/simulate.py",
    "sim/policies",
    "programs",
    "prefixes",
]
# Adapters inside core folders, with the I/O libraries each may use.
ADAPTERS: dict[str, set[str]] = {
    "queue/redis/connect.py": {"redis"},
    "queue/redis/queue.py": {"redis", "asyncio"},
    "queue/redis/batching.py": {"redis", "asyncio"},
    "queue/redis/plans.py": {"redis", "asyncio", "time"},
    "queue/redis/streams.py": {"redis", "asyncio"},
    "queue/redis/pokes.py": {"redis", "asyncio"},
    "queue/redis/stream_reads.py": {"redis", "asyncio"},
    "queue/redis/listed_index.py": {"redis"},
    "queue/redis/batch_store.py": {"redis"},
    "queue/redis/program_store.py": {"redis"},
    "programs/python_client.py": {"httpx"},
    # the live agent process beside the pure decision it runs (qlm/agents/README.md)
    "agents/agent.py": {"asyncio"},
    "agents/agent_events.py": {"asyncio"},
    "agents/leases.py": {"asyncio"},
    "queue/memory.py": {"asyncio"},
    "queue/memory_streams.py": {"asyncio"},
    "queue/queue_protocol.py": {"asyncio"},
    "engine/client.py": {"asyncio"},
    "engine/emulated.py": {"asyncio"},
    "engine/vllm/vllm_engine.py": {"aiohttp", "asyncio"},
    "engine/vllm/process.py": {"aiohttp", "asyncio", "subprocess"},
    "engine/vllm/reaper.py": {"subprocess", "time"},
    "engine/native/native_engine.py": {"asyncio"},
    "engine/native/contexts.py": {"asyncio"},
    "engine/vllm/request_streams.py": {"aiohttp", "asyncio"},
    "engine/profiling/vllm_profiler.py": {"httpx", "asyncio", "time"},
    "engine/profiling/probe_client.py": {"httpx", "asyncio"},
    "engine/profiling/profile_cli.py": {"asyncio"},
    "engine/tiny_models.py": set(),
}
# Must pass the strict check above (no asyncio, time or subprocess): the engine model, the
# observations and events the reconcile step and the simulator read, and vLLM's pure parts.
PURE_ENGINE = [
    "engine/engine_types.py",
    "engine/model/core.py",
    "engine/model/sequence.py",
    "engine/model/seq_queues.py",
    "engine/model/decode_batch.py",
    "engine/model/kv_cache.py",
    "engine/model/scheduler.py",
    "engine/model/segment.py",
    "config/engine_config.py",
    "engine/model/stats.py",
    "config/vllm_config.py",
    "engine/vllm/protocol.py",
    "engine/vllm/metrics.py",
]
# Where each I/O library may be imported at all (STYLE.md: only the queue's Redis adapter
# imports redis (the qlm/queue/redis package), only the api imports fastapi).
ONLY_IN: dict[str, tuple[str, ...]] = {
    "redis": ("queue/redis/",),
    "fastapi": ("api",),
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def core_files() -> list[Path]:
    files: list[Path] = []
    for part in CORE:
        target = PACKAGE / part
        files += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    return files


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_io_libraries_stay_in_their_adapters(path: Path) -> None:
    rel = str(path.relative_to(PACKAGE))
    for library, places in ONLY_IN.items():
        if library in imported_roots(path):
            assert rel.startswith(places), f"{rel} imports {library}; only {places} may"


@pytest.mark.parametrize("path", core_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_imports_no_io_library(path: Path) -> None:
    """Pure core modules import no I/O (time included: only qlm/clock.py reads it); the
    adapters that live beside them import only the I/O they are for."""
    allowed = ADAPTERS.get(str(path.relative_to(PACKAGE)), set())
    assert not (imported_roots(path) & IO_LIBRARIES) - allowed


@pytest.mark.parametrize("rel", PURE_ENGINE)
def test_the_engine_model_and_its_observations_are_pure(rel: str) -> None:
    """Named here so that a move cannot drop them from the strict check unnoticed."""
    path = PACKAGE / rel
    assert path in core_files()
    assert rel not in ADAPTERS
    assert not imported_roots(path) & IO_LIBRARIES
