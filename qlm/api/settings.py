"""The API's configuration: what the fleet serves, the SLO classes, and the admission limits.
Passed to `create_app`; nothing here reads the environment."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from qlm.config import QlmConfig, SloClassConfig
from qlm.types import SloClass

_WEEK_S = 7 * 24 * 3600.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelInfo(_Strict):
    max_context_tokens: int = Field(
        ge=2, le=100_000_000, description="Prompt plus output tokens the model accepts."
    )
    max_output_tokens: int | None = Field(
        default=None, ge=1, description="Cap on max_tokens for this model; None: the context."
    )


def _default_classes() -> tuple[SloClassConfig, ...]:
    return QlmConfig().slo_classes


class ApiSettings(_Strict):
    models: dict[str, ModelInfo] = Field(
        min_length=1, description="Every model the fleet can serve, loaded or not."
    )
    slo_classes: tuple[SloClassConfig, ...] = Field(
        default_factory=_default_classes, min_length=1, description="Classes clients may name."
    )
    default_slo_class: str = Field(default="interactive", description="Class of untagged requests.")
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="Larger request bodies get 413."
    )
    completion_timeout_s: float = Field(
        default=600.0, gt=0, description="A synchronous completion waits this long, then 504."
    )
    token_counter: str = Field(default="utf8-bytes", description="Registered token counter.")
    default_max_tokens: int = Field(
        default=256, ge=1, description="Output cap when a request gives none (within context)."
    )
    max_deadline_s: float = Field(
        default=_WEEK_S, gt=0, description="Largest deadline_s or TTFT target a request may set."
    )
    ready_timeout_s: float = Field(
        default=1.0, gt=0, description="/readyz fails when the queue does not answer in time."
    )

    @model_validator(mode="after")
    def _default_class_known(self) -> ApiSettings:
        names = [c.name for c in self.slo_classes]
        if len(names) != len(set(names)):
            raise ValueError("slo_classes: names must be unique")
        if self.default_slo_class not in names:
            raise ValueError(f"default_slo_class {self.default_slo_class!r} is not one of {names}")
        return self

    @classmethod
    def from_config(
        cls, config: QlmConfig, models: dict[str, ModelInfo], **overrides: Any
    ) -> ApiSettings:
        """Settings sharing the SLO classes and default class of a QlmConfig."""
        return cls(
            models=models,
            slo_classes=config.slo_classes,
            default_slo_class=config.default_slo_class,
            **overrides,
        )

    def slo_class_map(self) -> MappingProxyType[str, SloClass]:
        return MappingProxyType({c.name: c.to_slo_class() for c in self.slo_classes})
