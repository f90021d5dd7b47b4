"""Named registries for extension points (policies, engine adapters, ...).

Configuration (YAML) names a plugin; the registry turns the name into the
factory and gives a clear error listing the known names otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "UnknownPlugin"]

T = TypeVar("T", bound=Callable[..., Any])


class UnknownPlugin(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, T] = {}

    def register(self, name: str, factory: T | None = None):
        """``reg.register("name", f)`` or as a decorator ``@reg.register("name")``."""

        def add(f: T) -> T:
            if name in self._items and self._items[name] is not f:
                raise ValueError(f"{self.what} {name!r} is already registered")
            self._items[name] = f
            return f

        return add(factory) if factory is not None else add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownPlugin(f"unknown {self.what} {name!r}; known: {', '.join(sorted(self._items))}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
