"""The fleet file (`qlm serve --config FLEET.yaml`): one validated model for the whole live
control plane. Errors name file, line and field (qlm.config.load_yaml_model). Nothing here
reads the environment or secret files: the file names where secrets are (an environment
variable holding the queue URL or the Redis password, a mounted file with the password or
the API keys), and qlm/serve/secrets.py reads them when a process starts.

Sections: `qlm` (QlmConfig, policy_config.py), `queue` (QueueConfig), `api` (ApiConfig,
api_settings.py), `controller` (ControllerConfig), `agent` (AgentConfig, agent_settings.py),
`engine` (LiveEngineConfig), `metrics` (MetricsConfig, metrics_settings.py), `models`
(ModelConfig, api_settings.py) and `fleet` (FleetConfig, fleet_config.py: the same section as
in `qlm plan` snapshots and `qlm simulate` scenarios). Every settings class is in this package
(qlm/config/); the README's configuration section maps them all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator

from qlm.config import Problem, QlmConfig, StrictModel, fail_at
from qlm.config.agent_settings import AgentConfig
from qlm.config.api_settings import ApiConfig, ModelConfig
from qlm.config.engine_kinds import EngineKind
from qlm.config.fleet_config import FleetConfig
from qlm.config.metrics_settings import MetricsConfig
from qlm.config.queue_limits import check_queue_bounds
from qlm.types import Fleet, Instance, InstanceRole


class QueueConfig(StrictModel):
    url: str | None = Field(
        default=None,
        description="redis://[:password@]host:port/db, rediss:// for TLS, "
        "redis+sentinel://[:password@]host:port,host:port,.../service[/db] for the primary "
        "the Sentinels name (it follows a failover); none = in-memory.",
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
    sentinel_password_env: str | None = Field(
        default=None, description="Environment variable holding the Sentinels' own password."
    )
    replicas_to_ack: int = Field(
        default=0,
        ge=0,
        description="Replicas that must hold an enqueue, pull, requeue, result or output "
        "event (Redis WAIT) before it counts; 1 with a replica: an accepted request survives "
        "losing the primary. 0: the primary alone.",
    )
    replica_ack_timeout_s: float = Field(
        default=2.0, gt=0, description="Longest wait for the replicas; past it the write fails."
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
        schemes = ("memory", "redis", "rediss", "unix", "redis+sentinel")
        if url is not None and urlsplit(url).scheme not in schemes:
            raise ValueError(
                "must start with memory://, redis://, rediss:// (TLS), unix:// or redis+sentinel://"
            )
        return url

    @model_validator(mode="after")
    def _one_password_source(self) -> QueueConfig:
        if self.password_env is not None and self.password_file is not None:
            fail_at("QueueConfig", [(("password_file",), "set password_env or password_file")])
        return self


class ControllerConfig(StrictModel):
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
    kubernetes_scaling: bool = Field(
        default=False,
        description="Set the autoscaled pools' StatefulSet scale (qlm.autoscale.pools[]."
        "statefulset) through the Kubernetes API, in-cluster credentials; off: the desired "
        "replicas are only published (qlm_pool_desired_replicas).",
    )
    kubernetes_namespace: str | None = Field(
        default=None,
        min_length=1,
        description="The StatefulSets' namespace; default: the pod's own (its service account).",
    )

    moved_fields = MappingProxyType(
        {
            name: f"moved to qlm.control.{name} (shared with the simulator's scenario files)"
            for name in ("tick_s", "min_replan_interval_s", "published_members_per_instance")
        }
    )


class LiveEngineConfig(StrictModel):
    """How instances run: emulated engines (the profile on the wall clock), vLLM servers, or
    QLM's own engine (native: torch in the agent's process)."""

    kind: EngineKind = "emulated"
    speedup: float = Field(default=1.0, gt=0, le=1000, description="Emulated engines only.")
    seed: int = 0
    output_length: Literal["profile", "cap"] = Field(
        default="profile",
        description="Emulated engines: draw output lengths from the profile (capped by "
        "max_tokens) or always generate max_tokens.",
    )
    stream_interval_s: float = Field(
        default=0.05,
        gt=0,
        le=60,
        description="Emulated engines: generated tokens stream in chunks this often (engine "
        "seconds; the first token goes at once, the last chunk at the request's end). "
        "Replays of busy scenarios on a small host set it higher: every chunk costs the plane "
        "and the client CPU that a real deployment spreads over its own machines.",
    )
    standby_models: int = Field(
        default=0,
        ge=0,
        description="Emulated engines: models each keeps asleep beside the one it serves (the "
        "standby tier: a wake takes the profile's wake_s, and the control loop has tiers "
        "fetch the models worth keeping warm). vLLM engines set it under `vllm`.",
    )
    vllm: dict[str, object] = Field(
        default_factory=dict, description="VllmEngineConfig fields (vllm engines only)."
    )
    native: dict[str, object] = Field(
        default_factory=dict,
        description="NativeEngineConfig fields (native engines only; qlm/engine/native).",
    )


class ServeConfig(StrictModel):
    """The fleet file: every process of the live control plane reads the same one."""

    moved_fields = MappingProxyType(
        {
            "instances": "moved to fleet.instances",
            "profiles": "moved to fleet.profiles (in the profile file format)",
            "packaged_profiles": "moved to fleet.packaged_profiles",
            "gpu_memory_gib": "moved to fleet.gpu_types: {<type>: {memory_gib: ...}}",
        }
    )

    qlm: QlmConfig = Field(default_factory=QlmConfig, description="The policy core.")
    queue: QueueConfig = Field(default_factory=QueueConfig, description="The global queue.")
    api: ApiConfig = Field(default_factory=ApiConfig, description="The HTTP API.")
    controller: ControllerConfig = Field(
        default_factory=ControllerConfig, description="The control loop."
    )
    agent: AgentConfig = Field(default_factory=AgentConfig, description="The instance agents.")
    engine: LiveEngineConfig = Field(
        default_factory=LiveEngineConfig, description="How instances run."
    )
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="Observability.")
    models: tuple[ModelConfig, ...] = Field(
        min_length=1, description="Every model the fleet serves (the API lists them)."
    )
    fleet_config: FleetConfig = Field(alias="fleet", description="Instances and profiles.")

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
        for i, group in enumerate(self.fleet_config.instances):
            if group.model is not None and group.model not in names:
                yield ("fleet", "instances", i, "model"), f"{group.model!r} is not in models"
            if group.slices > 1:
                yield (
                    ("fleet", "instances", i, "slices"),
                    "the live plane runs one engine per instance (shared GPUs are simulated "
                    "only); to share a GPU between vLLM servers, declare several instances and "
                    "split its memory with --gpu-memory-utilization in engine.vllm.extra_args",
                )
            if group.role is not InstanceRole.BOTH:
                yield (
                    ("fleet", "instances", i, "role"),
                    "the live plane's engines prefill and decode their own requests (the "
                    "prefill/decode split is simulated only): leave role at both",
                )

    def _queue_problems(self) -> Iterator[Problem]:
        queue = self.queue
        known = [c.name for c in self.qlm.slo_classes]
        for name in queue.reserved_classes or ():
            if name not in known:
                yield ("queue", "reserved_classes"), f"{name!r} is not a class; known: {known}"
        try:
            check_queue_bounds(queue.max_queued, queue.max_queued_per_tenant, queue.reserved_queued)
        except ValueError as exc:
            yield ("queue", "reserved_queued"), str(exc)

    def _engine_problems(self) -> Iterator[Problem]:
        if self.engine.standby_models and self.engine.kind != "emulated":
            instead = {"vllm": "vLLM engines set engine.vllm.standby_models"}.get(
                self.engine.kind, f"{self.engine.kind} engines have no standby tier"
            )
            yield ("engine", "standby_models"), f"emulated engines only; {instead}"
        if self.engine.kind != "vllm":
            return
        from qlm.config.vllm_config import VllmEngineConfig

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

    def fleet(self) -> Fleet:
        """The instances, with the profiles of the served models on their GPU types."""
        return self.fleet_config.fleet(m.name for m in self.models)

    def instance_list(self) -> list[Instance]:
        return list(self.fleet().instances)
