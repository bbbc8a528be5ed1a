"""The strict base of every config model and the YAML loader: unknown fields are errors,
instances frozen, and an error names file, line and field. Nothing here reads the environment."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, NoReturn, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError


class StrictModel(BaseModel):
    """The base of every config model: unknown fields are errors, instances are frozen.

    A model whose file format renamed or moved a field lists it in `moved_fields` (old name
    -> where it is now): an old file is then refused with that hint at the old field's line
    instead of a bare "extra inputs are not permitted"."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    moved_fields: ClassVar[Mapping[str, str]] = MappingProxyType({})

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_fields(cls, data: Any) -> Any:
        if cls.moved_fields and isinstance(data, Mapping):
            moved = [(old, new) for old, new in cls.moved_fields.items() if old in data]
            if moved:
                fail_at(cls.__name__, [((old,), f"no longer read: {new}") for old, new in moved])
        return data


class ConfigError(ValueError):
    """A configuration file is invalid; the message names the file, line and field."""


Problem = tuple[tuple[str | int, ...], str]  # (location of the field, message)


def fail_at(title: str, problems: Sequence[Problem]) -> NoReturn:
    """Raise a ValidationError at precise field locations from a model validator, so that
    load_yaml_model names the field and its line instead of the model's top level."""
    raise ValidationError.from_exception_data(
        title,
        [
            InitErrorDetails(
                type=PydanticCustomError("reference", "{message}", {"message": message}),
                loc=loc,
                input=None,
            )
            for loc, message in problems
        ],
    )


_BASE_DIR: ContextVar[Path | None] = ContextVar("qlm_config_base_dir", default=None)


@contextmanager
def relative_to(base_dir: Path) -> Iterator[None]:
    """Resolve relative paths (traces, profile files) validated inside this block against
    base_dir; load_yaml_model validates a file inside such a block for the file's folder."""
    token = _BASE_DIR.set(base_dir)
    try:
        yield
    finally:
        _BASE_DIR.reset(token)


def resolve_relative(path: Path) -> Path:
    """A path as given when absolute (or outside a `relative_to` block), else under the
    block's base folder; resolved."""
    base = _BASE_DIR.get()
    return (path if path.is_absolute() or base is None else base / path).resolve()


M = TypeVar("M", bound=BaseModel)


def load_yaml_model(path: Path, model: type[M]) -> M:
    """Parse a YAML file into a pydantic model, with errors naming file, line and field.
    Relative paths in the file (resolve_relative) are relative to the file's folder."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
        root: yaml.Node | None = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    try:
        with relative_to(path.resolve().parent):
            return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise ConfigError(_describe(path, root, exc)) from exc


def _describe(path: Path, root: yaml.Node | None, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(top level)"
        line = _line_of(root, loc)
        where = f"{path}:{line}" if line else str(path)
        lines.append(f"{where}: {field}: {err['msg']}")
    return "\n".join(lines)


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest YAML node found along a pydantic error location."""
    found = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        child = _child(node, part)
        if child is None:
            break
        node = child
        found = node.start_mark.line + 1
    return found


def _child(node: yaml.Node | None, part: Any) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                found: yaml.Node = value
                return found
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        child: yaml.Node = node.value[part]
        return child
    return None
