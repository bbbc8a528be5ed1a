"""The API's configuration. `ApiConfig` is the API's own section (the fleet file's `api:`):
where it listens, its limits, where its keys are, the tenants' quotas and the SLO gate; one
default per field, here. `ApiAppConfig` is what `create_app` takes: that section with what the
fleet serves (its models, the SLO classes) and the keys, read. Nothing here reads the
environment or files (qlm/serve/secrets.py does, for the live processes)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType

from pydantic import Field, SecretStr, field_validator, model_validator

from qlm.config import QlmConfig, SloClassConfig, StrictModel
from qlm.config.engine_kinds import EngineKind
from qlm.types import SloClass

_WEEK_S = 7 * 24 * 3600.0


class ModelConfig(StrictModel):
    """A model the fleet serves, as clients see it (the fleet file's `models:` entries)."""

    name: str = Field(min_length=1, description="The name clients ask for.")
    max_context_tokens: int = Field(
        default=8192, ge=16, le=100_000_000, description="Prompt plus output tokens accepted."
    )
    max_output_tokens: int | None = Field(
        default=None, ge=1, description="Cap on max_tokens for this model; none: the context."
    )


def _default_classes() -> tuple[SloClassConfig, ...]:
    return QlmConfig().slo_classes


class ApiKey(StrictModel):
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


class QuotaConfig(StrictModel):
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


class BatchApiConfig(StrictModel):
    """The Files and Batch APIs: `api.batch` in the fleet file."""

    max_file_bytes: int = Field(
        default=100 * 1024 * 1024, ge=1024, description="Larger uploads get 413."
    )
    slo_class: str | None = Field(
        default=None,
        description="The class of a job's lines unless its metadata's qlm_slo_class names "
        "one; None: the configured class of lowest priority.",
    )
    poll_s: float = Field(
        default=0.5, gt=0, description="How often the batch runner looks at unfinished jobs."
    )
    prefix_planning: bool = Field(
        default=True,
        description="Plan each job as a whole before queueing it: groups by shared prefix, "
        "long decodes first, parts one engine batch holds (qlm/prefixes/job_plan.py).",
    )


class ProgramApiConfig(StrictModel):
    """Programs of calls (qlm/api/program_routes.py): `api.programs` in the fleet file."""

    max_calls: int = Field(default=256, ge=1, le=10_000, description="Calls per program.")
    max_references: int = Field(
        default=64, ge=1, description="Variables one call's prompt may use (fan-in)."
    )
    max_consumers: int = Field(
        default=256, ge=1, description="Calls one variable may feed (fan-out)."
    )
    poll_s: float = Field(
        default=0.5,
        gt=0,
        description="How often the program runner looks at running programs (it also wakes "
        "as soon as a call it queued ends).",
    )

    def limits(self) -> dict[str, int]:
        return {
            "max_calls": self.max_calls,
            "max_references": self.max_references,
            "max_consumers": self.max_consumers,
        }


class ApiConfig(StrictModel):
    """The API's settings: the fleet file's `api:` section."""

    host: str = Field(default="127.0.0.1", description="Address `qlm serve` and `qlm api` bind.")
    port: int = Field(default=8000, ge=0, le=65535, description="0 picks a free port.")
    keep_alive_s: int = Field(
        default=75,
        ge=1,
        description="How long an idle client connection stays open for its next request. "
        "Longer than the clients' and load balancers' own idle timeouts (httpx and the openai "
        "client: 5 s; cloud load balancers: 60 s), so that a client never sends a request "
        "on a connection the server is closing (a connection error the client cannot retry "
        "safely).",
    )
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
    keys: dict[str, SecretStr | list[SecretStr]] = Field(
        default_factory=dict,
        description="Inline tenant -> API key(s), for demos; real keys go in keys_file or "
        "keys_env. Any key configured turns authentication on.",
    )
    keys_file: Path | None = Field(
        default=None, description="YAML file of tenant -> key(s) (a mounted Secret)."
    )
    keys_env: str | None = Field(
        default="QLM_API_KEYS",
        description="Environment variable holding tenant -> key(s) as YAML, if set.",
    )
    quota: QuotaConfig = Field(
        default_factory=QuotaConfig, description="Every tenant's quotas, unless overridden."
    )
    tenant_quotas: dict[str, QuotaConfig] = Field(
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
    wait_forecast: bool = Field(
        default=True,
        description="Estimate each request's wait with the dispatch decision's forecast (the "
        "function the simulator grades; qlm/api/wait_forecast.py): one schedule of its model "
        "per admission, about 1 ms of CPU with 1,000 of its model queued "
        "(benchmarks/admission_cpu.py). Off: from the latest plan alone.",
    )

    batch: BatchApiConfig = Field(
        default_factory=lambda: BatchApiConfig(),
        description="The Files and Batch APIs (qlm/api/batch_routes.py).",
    )
    programs: ProgramApiConfig = Field(
        default_factory=lambda: ProgramApiConfig(),
        description="Programs of calls (qlm/api/program_routes.py).",
    )

    def quota_of(self, tenant: str) -> QuotaConfig:
        return self.tenant_quotas.get(tenant, self.quota)


class ApiAppConfig(StrictModel):
    """What `create_app` serves with: the API's settings, the fleet's models and SLO classes,
    and the API keys (read from where `api` says, by qlm/serve/secrets.py)."""

    models: tuple[ModelConfig, ...] = Field(
        min_length=1, description="Every model the fleet can serve, loaded or not."
    )
    slo_classes: tuple[SloClassConfig, ...] = Field(
        default_factory=_default_classes, min_length=1, description="Classes clients may name."
    )
    default_slo_class: str = Field(default="interactive", description="Class of untagged requests.")
    api_keys: tuple[ApiKey, ...] = Field(
        default=(), description="Keys and their tenants; none: no authentication (embedded)."
    )
    api: ApiConfig = Field(default_factory=ApiConfig, description="The API's settings.")
    engine_kind: EngineKind = Field(
        default="emulated",
        description="The fleet's engines: which OpenAI output fields are honoured "
        "(qlm/engine/openai_fields.py); the rest are refused.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ApiAppConfig:
        models = [m.name for m in self.models]
        if len(models) != len(set(models)):
            raise ValueError("models: names must be unique")
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

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    def model_map(self) -> MappingProxyType[str, ModelConfig]:
        return MappingProxyType({m.name: m for m in self.models})

    @classmethod
    def from_config(
        cls,
        config: QlmConfig,
        models: Sequence[ModelConfig],
        api: ApiConfig | None = None,
        api_keys: Sequence[ApiKey] = (),
        engine_kind: EngineKind = "emulated",
    ) -> ApiAppConfig:
        """The API of a fleet: the SLO classes and default class of its QlmConfig."""
        return cls(
            models=tuple(models),
            slo_classes=config.slo_classes,
            default_slo_class=config.default_slo_class,
            api_keys=tuple(api_keys),
            api=api if api is not None else ApiConfig(),
            engine_kind=engine_kind,
        )

    def slo_class_map(self) -> MappingProxyType[str, SloClass]:
        return MappingProxyType({c.name: c.to_slo_class() for c in self.slo_classes})
