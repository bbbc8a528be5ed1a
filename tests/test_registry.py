"""Policies registered by name; unknown names list the known ones."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from qlm.registry import Registry, UnknownPolicyError


@dataclass
class Policy:
    name: str
    weight: float = 1.0


def _registry() -> Registry[Policy]:
    registry: Registry[Policy] = Registry("grouping")
    registry.register("kmeans")(lambda weight=1.0: Policy("kmeans", weight))
    registry.register("exact")(lambda: Policy("exact"))
    return registry


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "expected"),
    [
        ("kmeans", (), {}, Policy("kmeans", 1.0)),  # factory defaults
        ("kmeans", (2.0,), {}, Policy("kmeans", 2.0)),  # positional args are passed through
        ("kmeans", (), {"weight": 3.0}, Policy("kmeans", 3.0)),  # and keyword args
        ("exact", (), {}, Policy("exact", 1.0)),  # each name builds its own policy
    ],
)
def test_create_by_name(
    name: str, args: tuple[object, ...], kwargs: dict[str, object], expected: Policy
) -> None:
    assert _registry().create(name, *args, **kwargs) == expected


def test_register_returns_factory_unchanged() -> None:
    # Usable as a class decorator: the decorated name still refers to the class.
    registry: Registry[Policy] = Registry("grouping")
    decorated = registry.register("p")(Policy)
    assert decorated is Policy
    assert registry.get("p") is Policy


def test_names_sorted() -> None:
    # Sorted, not insertion order ("kmeans" was registered first).
    assert _registry().names() == ["exact", "kmeans"]


def test_duplicate_registration_rejected() -> None:
    registry = _registry()
    with pytest.raises(ValueError, match="grouping policy 'kmeans' registered twice"):
        registry.register("kmeans")(lambda: Policy("other"))
    # The first registration survives.
    assert registry.create("kmeans") == Policy("kmeans")


@pytest.mark.parametrize("call", ["get", "create"])
def test_unknown_name_lists_known(call: str) -> None:
    registry = _registry()
    with pytest.raises(UnknownPolicyError) as info:
        getattr(registry, call)("kmean")
    error = info.value
    # str() is the plain message (KeyError would otherwise wrap it in quotes).
    assert str(error) == "unknown grouping policy 'kmean'; known: exact, kmeans"
    assert (error.kind, error.name, error.known) == ("grouping", "kmean", ["exact", "kmeans"])
    # It is a KeyError, so lookups that catch KeyError also catch it.
    assert isinstance(error, KeyError)


def test_registries_are_independent() -> None:
    # A name in one registry is unknown in another (no module-global table).
    other: Registry[Policy] = Registry("planner")
    _registry()
    with pytest.raises(UnknownPolicyError, match="unknown planner policy 'kmeans'"):
        other.get("kmeans")
