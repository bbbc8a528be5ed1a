"""Every configuration model of QLM, in one package: what a fleet file, a snapshot, a scenario
and the chart's values may say, validated. Files are YAML; errors name file, line and field;
nothing here reads the environment. Every model derives from `StrictModel` (unknown fields are
errors, instances frozen) and is named `...Config`.

    strict.py           StrictModel, ConfigError, the YAML loader (file:line errors)
    policy_config.py    QlmConfig: SLO classes, grouping, estimator, planner, control, autoscale
    fleet_config.py     the `fleet:` section: instance groups (fleet_groups.py), GPU types,
                        profiles (profile_files.py: the profile file format)
    serve_config.py     the fleet file (ServeConfig): queue, controller, engine and the sections
                        below; engine_kinds.py (`engine.kind`), queue_limits.py (the queue
                        bounds' consistency rule, which the queues' QueueBounds applies too)
    api_settings.py     `api:`, `models:`          agent_settings.py    `agent:`
    metrics_settings.py `metrics:`                 redis_config.py      the Redis queue
    engine_config.py    the engine model's scheduler (`engine:` of a scenario)
    vllm_config.py      `engine.vllm`              native_config.py     `engine.native`

The package imports only qlm.types and qlm.perf: the components import their settings from
here, never the other way round. The names below are the policy core's and the loader's.
"""

from qlm.config.policy_config import (
    AutoscaleConfig,
    AutoscalePoolConfig,
    ControlConfig,
    EstimatorConfig,
    GroupingConfig,
    PlannerBackend,
    PlannerConfig,
    QlmConfig,
    SloClassConfig,
)
from qlm.config.strict import (
    ConfigError,
    Problem,
    StrictModel,
    fail_at,
    load_yaml_model,
    relative_to,
    resolve_relative,
)

__all__ = [
    "AutoscaleConfig",
    "AutoscalePoolConfig",
    "ConfigError",
    "ControlConfig",
    "EstimatorConfig",
    "GroupingConfig",
    "PlannerBackend",
    "PlannerConfig",
    "Problem",
    "QlmConfig",
    "SloClassConfig",
    "StrictModel",
    "fail_at",
    "load_yaml_model",
    "relative_to",
    "resolve_relative",
]
