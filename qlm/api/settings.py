"""The API's configuration: what the fleet serves, the SLO classes, the admission limits, the
API keys with their tenants and the tenants' quotas. Passed to `create_app`; nothing here
reads the environment or files (qlm/serve/secrets.py does, for the live processes)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

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


class ApiKey(_Strict):
    """One key and the tenant it authenticates. The key never appears in repr or logs."""

    key: SecretStr = Field(description="The bearer token: 8 to 512 characters, no spaces.")
    tenant: str = Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@-]+$", description="Tenant name."
    )

    @field_validator("key")
    @classmethod
    def _usable(cls, key: SecretStr) -> SecretStr:
        """Says what is wrong without repeating the key or its length."""
        text = key.get_secret_value()
        if not 8 <= len(text) <= 512 or any(c.isspace() for c in text):
            raise ValueError("a key must have 8 to 512 characters and no whitespace")
        return key


class QuotaSettings(_Strict):
    """A tenant's admission quotas, each a token bucket (None: no limit). Tokens are charged
    at admission as prompt tokens plus the output cap, the most the request can use."""

    requests_per_s: float | None = Field(default=None, gt=0, description="Sustained request rate.")
    burst_requests: int | None = Field(
        default=None, ge=1, description="Requests admitted at once; default: one second's worth."
    )
    tokens_per_min: float | None = Field(
        default=None, gt=0, description="Sustained prompt + output-cap tokens per minute."
    )
    burst_tokens: int | None = Field(
        default=None, ge=1, description="Tokens admitted at once; default: one minute's worth."
    )

    @property
    def limited(self) -> bool:
        return self.requests_per_s is not None or self.tokens_per_min is not None


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
    api_keys: tuple[ApiKey, ...] = Field(
        default=(), description="Keys and their tenants; none: no authentication (embedded)."
    )
    quota: QuotaSettings = Field(
        default_factory=QuotaSettings, description="Every tenant's quotas, unless overridden."
    )
    tenant_quotas: dict[str, QuotaSettings] = Field(
        default_factory=dict, description="Quotas of named tenants (replace `quota` for them)."
    )
    queue_full_retry_after_s: int = Field(
        default=1, ge=1, description="Retry-After of a 429 when the queue (or tenant) is full."
    )
    reject_unattainable_slo: bool = Field(
        default=False,
        description="Refuse (429) a request whose TTFT deadline the latest plan says it misses.",
    )
    plan_max_age_s: float = Field(
        default=30.0, gt=0, description="An older plan says nothing about admission."
    )
    plan_refresh_s: float = Field(
        default=1.0, ge=0, description="How often admission re-reads the plan from the queue."
    )

    @model_validator(mode="after")
    def _default_class_known(self) -> ApiSettings:
        names = [c.name for c in self.slo_classes]
        if len(names) != len(set(names)):
            raise ValueError("slo_classes: names must be unique")
        if self.default_slo_class not in names:
            raise ValueError(f"default_slo_class {self.default_slo_class!r} is not one of {names}")
        keys = [k.key.get_secret_value() for k in self.api_keys]
        if len(keys) != len(set(keys)):
            raise ValueError("api_keys: a key is listed twice")
        return self

    @property
    def auth_required(self) -> bool:
        """Authentication is on exactly when keys are configured."""
        return bool(self.api_keys)

    def quota_of(self, tenant: str) -> QuotaSettings:
        return self.tenant_quotas.get(tenant, self.quota)

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
