"""Named registries for extension points (policies, engine adapters, ...).

Configuration (YAML) names a plugin; the registry turns the name into the
factory and gives a clear error listing the known names otherwise.  A registry
of an extension point knows its ``typing.Protocol``: :meth:`Registry.build`
checks what a factory made implements it, so a plugin registered in the wrong
place fails where the configuration names it, not at the first request.
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
    def __init__(self, what: str, protocol: type | None = None) -> None:
        self.what = what
        self.protocol = protocol  # a runtime-checkable Protocol what its factories make must implement
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

    def build(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """The plugin ``name`` made by its factory, checked against the protocol."""
        return self.check(self.get(name)(*args, **kwargs), name)

    def check(self, plugin: Any, name: str) -> Any:
        """``plugin`` if it implements the protocol; TypeError naming what it lacks otherwise."""
        p = self.protocol
        if p is None or isinstance(plugin, p):
            return plugin
        members = set(getattr(p, "__annotations__", {})) | {
            k for k, v in vars(p).items() if callable(v) and not k.startswith("_")}
        missing = sorted(m for m in members if not hasattr(plugin, m))
        raise TypeError(f"{self.what} {name!r}: {type(plugin).__name__} does not implement {p.__name__}"
                        + (f" (it has no {', '.join(missing)})" if missing else ""))

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
