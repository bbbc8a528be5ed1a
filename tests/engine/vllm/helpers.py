"""Shared by the vLLM engine tests: a request and an engine config (no server)."""

from __future__ import annotations

from pathlib import Path

from qlm.config.vllm_config import VllmEngineConfig
from qlm.types import Request


def make_request(
    rid: str,
    model: str = "tiny-a",
    *,
    max_output_tokens: int = 16,
    prompt_tokens: int = 20,
    prompt: str | None = None,
) -> Request:
    return Request(
        id=rid,
        model=model,
        prompt_tokens=prompt_tokens,
        max_output_tokens=max_output_tokens,
        slo_class="interactive",
        arrival_at_s=0.0,
        ttft_deadline_at_s=1e9,
        prompt=prompt,
    )


def config(**overrides: object) -> VllmEngineConfig:
    fields: dict[str, object] = {"models": {"tiny-a": Path("/m/a"), "tiny-b": Path("/m/b")}}
    return VllmEngineConfig.model_validate(fields | overrides)
