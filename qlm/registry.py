"""Policies registered by name and chosen in configuration (no if/elif over names)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownPolicyError(KeyError):
    """A configuration named a policy that is not registered."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        super().__init__(f"unknown {kind} policy {name!r}; known: {', '.join(known)}")

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps a policy name to a factory building it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def add(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise ValueError(f"{self.kind} policy {name!r} registered twice")
            self._factories[name] = factory
            return factory

        return add

    def get(self, name: str) -> Callable[..., T]:
        try:
            return self._factories[name]
        except KeyError:
            raise UnknownPolicyError(self.kind, name, self.names()) from None

    def create(self, name: str, *args: object, **kwargs: object) -> T:
        return self.get(name)(*args, **kwargs)

    def names(self) -> list[str]:
        return sorted(self._factories)
