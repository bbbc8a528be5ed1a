"""The fleet file (`qlm serve --config FLEET.yaml`): one validated model for the whole live
control plane. Errors name file, line and field (qlm.config.load_yaml_model). Nothing here
reads the environment or secret files: the file names where secrets are (an environment
variable holding the queue URL or the Redis password, a mounted file with the password or
the API keys), and qlm/serve/secrets.py reads them when a process starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from qlm.agents.reconcile import ReconcileOptions
from qlm.api.settings import QuotaSettings
from qlm.config import Problem, QlmConfig, fail_at
from qlm.metrics.settings import MetricsSettings
from qlm.perf.profile import GIB, Profile
from qlm.queue.bounds import QueueBounds
from qlm.snapshot import ProfileSpec
from qlm.types import DEFAULT_GPU_TYPES, Fleet, Instance


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QueueSettings(_Strict):
    url: str | None = Field(
        default=None,
        description="redis://[:password@]host:port/db, rediss:// for TLS; none = in-memory.",
    )
    url_env: str | None = Field(
        default=None, description="Name of an environment variable holding the URL (secrets)."
    )
    key_prefix: str = Field(default="qlm", min_length=1, description="Redis key namespace.")
    username: str | None = Field(default=None, description="Redis ACL user; overrides the URL's.")
    password_env: str | None = Field(
        default=None, description="Environment variable holding the Redis password."
    )
    password_file: Path | None = Field(
        default=None, description="File holding the Redis password (a mounted Secret)."
    )
    ssl_ca_certs: Path | None = Field(default=None, description="CA bundle (rediss://).")
    ssl_certfile: Path | None = Field(default=None, description="Client certificate (mTLS).")
    ssl_keyfile: Path | None = Field(default=None, description="Client key (mTLS).")
    ssl_cert_reqs: Literal["required", "optional", "none"] = "required"
    max_queued: int | None = Field(
        default=None, ge=0, description="Queued requests at most (429 beyond); none: unbounded."
    )
    max_queued_per_tenant: int | None = Field(
        default=None, ge=0, description="Queued requests of one tenant at most (429 beyond)."
    )
    reserved_queued: int = Field(
        default=0, ge=0, description="Places of max_queued only reserved_classes may take."
    )
    reserved_classes: tuple[str, ...] | None = Field(
        default=None,
        description="Classes that may take reserved places; none: the classes "
        "of the highest priority (interactive).",
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str | None) -> str | None:
        if url is not None and urlsplit(url).scheme not in ("memory", "redis", "rediss", "unix"):
            raise ValueError("must start with memory://, redis://, rediss:// (TLS) or unix://")
        return url

    @model_validator(mode="after")
    def _one_password_source(self) -> QueueSettings:
        if self.password_env is not None and self.password_file is not None:
            fail_at("QueueSettings", [(("password_file",), "set password_env or password_file")])
        return self


class ApiServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535, description="0 picks a free port.")
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    completion_timeout_s: float = Field(default=600.0, gt=0)
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
    quota: QuotaSettings = Field(
        default_factory=QuotaSettings, description="Every tenant's request and token quotas."
    )
    tenant_quotas: dict[str, QuotaSettings] = Field(
        default_factory=dict, description="Quotas of named tenants (replace `quota` for them)."
    )
    queue_full_retry_after_s: int = Field(
        default=1, ge=1, description="Retry-After of a 429 when the queue is full."
    )
    reject_unattainable_slo: bool = Field(
        default=False, description="Refuse requests the latest plan predicts will be late."
    )
    plan_max_age_s: float = Field(default=30.0, gt=0, description="Older plans say nothing.")
    plan_refresh_s: float = Field(default=1.0, ge=0, description="Re-read the plan this often.")


class ControllerSettings(_Strict):
    """The live control loop's process settings. When it checks and re-plans, and how much of
    each virtual queue agents see, is `qlm.control` (QlmConfig.control), shared with the
    simulator."""

    leader_lease_s: float = Field(default=5.0, gt=0, description="Leader lease in Redis.")
    node_id: str | None = Field(default=None, description="Leader-election id; default random.")
    instance_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="An instance whose agent has not reported for this long (controller's "
        "clock) is down: nothing is planned onto it until it reports again.",
    )
    min_round_interval_s: float = Field(
        default=0.01,
        ge=0,
        description="Control rounds start at most this often; arrivals in between are taken "
        "together.",
    )

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in MOVED_TO_CONTROL:
                if name in data:
                    raise ValueError(
                        f"controller.{name} moved to qlm.control.{name} (shared with the "
                        "simulator's scenario files)"
                    )
        return data


MOVED_TO_CONTROL = ("tick_s", "min_replan_interval_s", "published_members_per_instance")


class AgentSettings(_Strict):
    poll_s: float = Field(
        default=0.25,
        gt=0,
        description="Longest sleep between agent rounds; engine events and new plans wake "
        "the agent before that.",
    )
    lease_s: float = Field(
        default=30.0, gt=0, description="A pulled request returns to the queue if not renewed."
    )
    status_every_s: float = Field(default=0.5, gt=0, description="Instance status report period.")
    allow_evict: bool = True
    allow_model_swap: bool = True
    allow_kv_swap: bool = True

    max_dispatches: int = Field(
        default=3,
        ge=1,
        description="A request its engine aborted (not an eviction) this many times fails "
        "instead of going back to the queue again.",
    )
    engine_backlog: int = Field(
        default=0,
        ge=0,
        description="Requests admitted beyond the engine's sequence slots (they wait inside "
        "the engine, so a finished sequence is replaced at the engine's next step).",
    )

    def reconcile_options(self) -> ReconcileOptions:
        return ReconcileOptions(
            allow_evict=self.allow_evict,
            allow_model_swap=self.allow_model_swap,
            allow_kv_swap=self.allow_kv_swap,
            engine_backlog=self.engine_backlog,
        )


class EngineSettings(_Strict):
    kind: Literal["emulated", "vllm"] = "emulated"
    speedup: float = Field(default=1.0, gt=0, le=1000, description="Emulated engines only.")
    seed: int = 0
    output_length: Literal["profile", "cap"] = Field(
        default="profile",
        description="Emulated engines: draw output lengths from the profile (capped by "
        "max_tokens) or always generate max_tokens.",
    )
    vllm: dict[str, object] = Field(
        default_factory=dict, description="VllmEngineConfig fields (vllm engines only)."
    )


class ModelSettings(_Strict):
    name: str = Field(min_length=1)
    max_context_tokens: int = Field(default=8192, ge=16)


class InstanceSettings(_Strict):
    id: str = Field(min_length=1, description="Id; with count > 1, -0, -1, ... are appended.")
    gpu_type: str = Field(min_length=1)
    gpu_count: int = Field(default=1, ge=1)
    model: str | None = Field(default=None, description="Model loaded at start.")
    count: int = Field(default=1, ge=1, le=10_000)


class ServeConfig(_Strict):
    qlm: QlmConfig = Field(default_factory=QlmConfig)
    queue: QueueSettings = Field(default_factory=QueueSettings)
    api: ApiServerSettings = Field(default_factory=ApiServerSettings)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    gpu_memory_gib: dict[str, float] = Field(
        default_factory=dict, description="Extra or overridden GPU types: name -> GiB per GPU."
    )
    packaged_profiles: bool = Field(
        default=True,
        description="Start from the profiles shipped in qlm/engine/profiling/profiles.",
    )
    profiles: tuple[ProfileSpec, ...] = Field(
        default=(), description="Inline profiles; they override packaged ones."
    )
    models: tuple[ModelSettings, ...] = Field(min_length=1)
    instances: tuple[InstanceSettings, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> ServeConfig:
        self.metrics.check_classes({c.name for c in self.qlm.slo_classes})
        problems = [*self._fleet_problems(), *self._queue_problems(), *self._engine_problems()]
        if problems:
            fail_at("ServeConfig", problems)
        return self

    def _fleet_problems(self) -> Iterator[Problem]:
        names = [m.name for m in self.models]
        if len(names) != len(set(names)):
            yield ("models",), "names must be unique"
        gpu_types = self._gpu_memory()
        for i, inst in enumerate(self.instances):
            if inst.gpu_type not in gpu_types:
                yield (
                    ("instances", i, "gpu_type"),
                    f"{inst.gpu_type!r} unknown; known: {sorted(gpu_types)} "
                    "(add it under gpu_memory_gib)",
                )
            if inst.model is not None and inst.model not in names:
                yield ("instances", i, "model"), f"{inst.model!r} is not in models"
        if all(inst.gpu_type in gpu_types for inst in self.instances):
            ids = [i.id for i in self.instance_list()]
            if len(ids) != len(set(ids)):
                yield ("instances",), "ids must be unique"

    def _queue_problems(self) -> Iterator[Problem]:
        queue = self.queue
        known = [c.name for c in self.qlm.slo_classes]
        for name in queue.reserved_classes or ():
            if name not in known:
                yield ("queue", "reserved_classes"), f"{name!r} is not a class; known: {known}"
        try:
            self.queue_bounds()
        except ValueError as exc:
            yield ("queue", "reserved_queued"), str(exc)

    def _engine_problems(self) -> Iterator[Problem]:
        if self.engine.kind != "vllm":
            return
        from qlm.engine.vllm.config import VllmEngineConfig

        try:
            VllmEngineConfig.model_validate(self.engine.vllm)
        except ValidationError as exc:
            for err in exc.errors():
                yield ("engine", "vllm", *err["loc"]), err["msg"]

    def reserved_classes(self) -> frozenset[str]:
        """The classes that may take reserved queue places: as configured, else those of the
        highest priority."""
        if self.queue.reserved_classes is not None:
            return frozenset(self.queue.reserved_classes)
        top = max(c.priority for c in self.qlm.slo_classes)
        return frozenset(c.name for c in self.qlm.slo_classes if c.priority == top)

    def queue_bounds(self) -> QueueBounds:
        """The queue's bounds (ValueError when inconsistent)."""
        q = self.queue
        return QueueBounds(
            q.max_queued, q.max_queued_per_tenant, q.reserved_queued, self.reserved_classes()
        )

    def _gpu_memory(self) -> dict[str, int]:
        memory = {name: g.memory_bytes for name, g in DEFAULT_GPU_TYPES.items()}
        memory.update({name: int(gib * GIB) for name, gib in self.gpu_memory_gib.items()})
        return memory

    def instance_list(self) -> list[Instance]:
        return list(self._instances())

    def _instances(self) -> Iterator[Instance]:
        memory = self._gpu_memory()
        for spec in self.instances:
            for k in range(spec.count):
                inst_id = spec.id if spec.count == 1 else f"{spec.id}-{k}"
                yield Instance(
                    inst_id, spec.gpu_type, spec.gpu_count, memory[spec.gpu_type], spec.model
                )

    def profile_list(self) -> list[Profile]:
        models = {m.name for m in self.models}
        found: dict[tuple[str, str], Profile] = {}
        if self.packaged_profiles:
            from qlm.engine.profiling.library import packaged_profiles

            found.update({p.key: p for p in packaged_profiles() if p.model in models})
        found.update(
            {(p.model, p.gpu_type): p.to_profile() for p in self.profiles if p.model in models}
        )
        return list(found.values())

    def fleet(self) -> Fleet:
        return Fleet.of(self.instance_list(), self.profile_list())

    def max_context_tokens(self) -> dict[str, int]:
        return {m.name: m.max_context_tokens for m in self.models}
