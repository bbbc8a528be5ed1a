"""Validated configuration: defaults, YAML loading, and errors that name file, line and field."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from types import MappingProxyType

import pytest
from pydantic import ValidationError

from qlm.config import (
    ConfigError,
    EstimatorConfig,
    GroupingConfig,
    PlannerConfig,
    QlmConfig,
    SloClassConfig,
    StrictModel,
    load_yaml_model,
)
from qlm.types import DEFAULT_SLO_CLASSES


def _write(tmp_path: Path, text: str, name: str = "qlm.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


# --- defaults -----------------------------------------------------------------------------


def test_defaults() -> None:
    cfg = QlmConfig()
    # The paper's three classes, in order, with interactive as the default tag.
    assert [c.name for c in cfg.slo_classes] == ["interactive", "batch-1", "batch-2"]
    assert cfg.default_slo_class == "interactive"
    assert cfg.estimator.policy == "rwt"
    assert cfg.estimator.percentile == 0.95  # p95 TTFT is the reported quantile
    assert cfg.planner.policy == "milp"
    assert cfg.planner.backend == "cpsat"
    assert cfg.planner.time_limit_s == 0.8  # planning must fit well under a second
    assert cfg.grouping.policy == "kmeans"


def test_default_slo_class_map_round_trips_to_types() -> None:
    # Config classes convert back into exactly the SloClass defaults they were built from.
    assert QlmConfig().slo_class_map() == {c.name: c for c in DEFAULT_SLO_CLASSES}


@pytest.mark.parametrize(
    ("avg_batch_size", "delta", "expected"),
    [
        (32, 4.0, 128),  # defaults: 32 x 4
        (10, 2.5, 25),  # 10 x 2.5
        (3, 0.1, 1),  # 0.3 rounds down to 0, floored at 1
    ],
)
def test_max_group_size(avg_batch_size: int, delta: float, expected: int) -> None:
    assert GroupingConfig(avg_batch_size=avg_batch_size, delta=delta).max_group_size == expected


@pytest.mark.parametrize(
    ("model", "kwargs"),
    [
        (EstimatorConfig, {"percentile": 0.5}),  # must be above the median (gt 0.5)
        (EstimatorConfig, {"percentile": 1.0}),  # p100 has no finite normal quantile
        (PlannerConfig, {"time_limit_s": 0.0}),  # gt 0
        (PlannerConfig, {"backend": "gurobi"}),  # not one of the three backends
        (GroupingConfig, {"avg_batch_size": 0}),  # ge 1
        (SloClassConfig, {"name": "x", "ttft_s": 8 * 24 * 3600}),  # above the one-week cap
    ],
)
def test_component_ranges(model: type[object], kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        model(**kwargs)


# --- loading ------------------------------------------------------------------------------


def test_load_valid_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
        slo_classes:
          - name: chat
            ttft_s: 2
            completion_s: 30
            lateness_weight: 50
            priority: 3
          - name: offline
            ttft_s: 7200
        default_slo_class: chat
        planner:
          backend: pulp-highs
          time_limit_s: 2.5
        """,
    )
    cfg = load_yaml_model(path, QlmConfig)
    slos = cfg.slo_class_map()
    assert set(slos) == {"chat", "offline"}
    assert slos["chat"].completion_s == 30.0
    assert slos["chat"].priority == 3
    assert slos["offline"].lateness_weight == 1.0  # unspecified -> field default
    assert cfg.planner.backend == "pulp-highs"
    assert cfg.planner.time_limit_s == 2.5
    assert cfg.planner.threads == 2  # sections not named in the file keep their defaults
    assert cfg.grouping == GroupingConfig()


def test_load_empty_file_gives_defaults(tmp_path: Path) -> None:
    # An empty document parses to None, which is read as "no overrides".
    assert load_yaml_model(_write(tmp_path, ""), QlmConfig) == QlmConfig()


def test_load_other_component_model(tmp_path: Path) -> None:
    # load_yaml_model is generic over the model it is given.
    path = _write(tmp_path, "percentile: 0.99\n")
    assert load_yaml_model(path, EstimatorConfig).percentile == 0.99


# Each case: file text, the 1-based line the error points at, the field path, a message part.
INVALID_CASES = [
    pytest.param(
        """
        planner:
          backend: cpsat
          time_limit_s: -1
        """,
        3,  # the value -1 is on line 3
        "planner.time_limit_s",
        "greater than 0",
        id="negative-time-limit",
    ),
    pytest.param(
        """
        grouping:
          avg_batch_size: 16
          colour: blue
        """,
        3,  # the unknown key's value is on line 3
        "grouping.colour",
        "Extra inputs are not permitted",
        id="unknown-nested-key",
    ),
    pytest.param(
        """
        # comment
        planer:
          time_limit_s: 1
        """,
        3,  # a misspelt top-level section; its mapping starts on line 3
        "planer",
        "Extra inputs are not permitted",
        id="unknown-top-level-key",
    ),
    pytest.param(
        """
        default_slo_class: a
        slo_classes:
          - name: a
            ttft_s: 5
          - name: b
            ttft_s: soon
        """,
        6,  # second list entry (index 1), its ttft_s on line 6
        "slo_classes.1.ttft_s",
        "valid number",
        id="wrong-type-in-second-class",
    ),
    pytest.param(
        """
        default_slo_class: a
        slo_classes:
          - name: a
            ttft_s: 5
            deadline: 9
        """,
        5,  # an unknown key inside the first class
        "slo_classes.0.deadline",
        "Extra inputs are not permitted",
        id="unknown-key-in-class",
    ),
]


@pytest.mark.parametrize(("text", "line", "field", "message"), INVALID_CASES)
def test_invalid_file_error_names_file_line_field(
    tmp_path: Path, text: str, line: int, field: str, message: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_yaml_model(path, QlmConfig)
    error = str(info.value)
    assert f"{path}:{line}: {field}: " in error
    assert message in error


def test_every_error_reported_on_its_own_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
        planner:
          time_limit_s: -1
          threads: 0
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_yaml_model(path, QlmConfig)
    # Two bad fields -> two lines, each with its own location.
    assert str(info.value).splitlines() == [
        f"{path}:2: planner.time_limit_s: Input should be greater than 0",
        f"{path}:3: planner.threads: Input should be greater than or equal to 1",
    ]


def test_invalid_yaml(tmp_path: Path) -> None:
    path = _write(tmp_path, "planner: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML") as info:
        load_yaml_model(path, QlmConfig)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match="cannot read") as info:
        load_yaml_model(path, QlmConfig)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            """
            default_slo_class: realtime
            """,
            "default_slo_class 'realtime' is not one of",
            id="default-not-a-class",
        ),
        pytest.param(
            """
            default_slo_class: a
            slo_classes:
              - {name: a, ttft_s: 1}
              - {name: a, ttft_s: 2}
            """,
            "names must be unique",
            id="duplicate-class-names",
        ),
    ],
)
def test_cross_field_errors(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_yaml_model(path, QlmConfig)
    error = str(info.value)
    # A whole-model rule has no single field: it is reported at the top level, line 1.
    assert f"{path}:1: (top level): " in error
    assert message in error


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"default_slo_class": "nope"}, "is not one of"),
        (
            {
                "default_slo_class": "a",
                "slo_classes": ({"name": "a", "ttft_s": 1}, {"name": "a", "ttft_s": 2}),
            },
            "names must be unique",
        ),
    ],
)
def test_cross_field_errors_in_code(kwargs: dict[str, object], message: str) -> None:
    # The same rules hold when the config is built in code rather than loaded.
    with pytest.raises(ValidationError, match=message):
        QlmConfig.model_validate(kwargs)


def test_config_is_frozen() -> None:
    with pytest.raises(ValidationError):
        QlmConfig().planner.time_limit_s = 5.0  # type: ignore[misc]


def test_completion_before_ttft_rejected_at_load(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
        default_slo_class: a
        slo_classes:
          - name: a
            ttft_s: 5
            completion_s: 1
        """,
    )
    # SloClass rejects completion_s < ttft_s; the config layer should reject it at load time.
    with pytest.raises(ConfigError, match="completion_s"):
        load_yaml_model(path, QlmConfig)


# --- one base, one suffix -------------------------------------------------------------------

PACKAGE = Path(__file__).parent.parent / "qlm"
# Not config files' models: StreamOptions is the OpenAI request body's `stream_options`;
# QlmVariant is the simulator's qlm ablation options (a dataclass; when the loop checks and
# re-plans is QlmConfig.control); ModelSpec holds a model's public figures (profiling).
NOT_RENAMED = {"StreamOptions", "QlmVariant", "ModelSpec"}


def _classes() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found.append((str(path.relative_to(PACKAGE)), node))
    return found


def test_the_strict_base_is_declared_once() -> None:
    """Config models derive from qlm.config.StrictModel instead of repeating extra="forbid"."""
    strict = [
        f"{path}:{node.name}"
        for path, node in _classes()
        if 'extra="forbid"' in ast.unparse(node).replace("'", '"')
    ]
    assert strict == ["config/strict.py:StrictModel"]


def test_config_classes_end_in_config() -> None:
    odd = [
        f"{path}:{node.name}"
        for path, node in _classes()
        if node.name.endswith(("Settings", "Spec", "Options")) and node.name not in NOT_RENAMED
    ]
    assert odd == []
    assert {node.name for _, node in _classes()} >= NOT_RENAMED  # no stale exceptions


def test_moved_fields_are_refused_with_where_they_went() -> None:
    class Old(StrictModel):
        moved_fields = MappingProxyType({"old_name": "renamed to new_name"})
        new_name: int = 0

    assert Old(new_name=1).new_name == 1
    with pytest.raises(ValidationError, match="old_name\n  no longer read: renamed to new_name"):
        Old.model_validate({"old_name": 1})
