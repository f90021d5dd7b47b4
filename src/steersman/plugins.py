"""Named registries for extension points (policies, engine adapters, ...).

Configuration (YAML) names a plugin; the registry turns the name into the
factory and gives a clear error listing the known names otherwise.  A registry
of an extension point knows its ``typing.Protocol``: :meth:`Registry.build`
checks what a factory made implements it, so a plugin registered in the wrong
place fails where the configuration names it, not at the first request.

Plugins outside steersman register themselves when their module is imported.
:func:`load_plugins` imports them before a configuration is read: every entry
point of the group ``steersman.plugins`` an installed package declares (as
pytest's ``pytest11``), and the modules a fleet file lists under ``plugins:``.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

__all__ = ["ENTRY_POINT_GROUP", "PluginLoadError", "Registry", "UnknownPlugin", "load_plugins"]

#: the entry-point group an installed package names its plugin modules in (``[project.entry-points."steersman.plugins"]``)
ENTRY_POINT_GROUP = "steersman.plugins"

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
        by = sys._getframe(1).f_globals.get("__name__", "")  # the module registering (a failed plugin's rolls back)

        def add(f: T) -> T:
            if name in self._items and self._items[name] is not f:
                raise ValueError(f"{self.what} {name!r} is already registered")
            if name not in self._items and _recording is not None:
                _recording.append((self, name, by))
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


class PluginLoadError(Exception):
    """A plugin module (an entry point or a fleet file's ``plugins:``) could not be imported: the message names it."""


_loaded: set[tuple[str, str]] = set()  # the entry points loaded (name, value): once a process each
#: every installed entry point loaded: the scan (~3.6 ms, more than half of a fleet file's parse) is not made again
_scanned = False


_recording: list[tuple[Registry, str, str]] | None = None  # registrations during a plugin's load: (registry, name, by)
_LOCK = threading.Lock()  # one load at a time (a reload imports in a worker thread)


def _rolled_back(load: Callable[[], Any], also: str | None = None) -> None:
    """Runs ``load`` (an import that registers plugins); if it raises, the names registered meanwhile by modules the
    failure left unimported (and by ``also``: an entry point's callable that raised) are unregistered, so the module
    fixed and loaded again registers them without 'already registered'; a helper module it imported that loaded fine
    keeps its names (it stays imported: it would not register them again)."""
    global _recording
    _recording = made = []
    try:
        load()
    except BaseException:
        for reg, name, by in made:
            if by not in sys.modules or by == also:
                reg._items.pop(name, None)
        raise
    finally:
        _recording = None


def _entry_point(ep: Any) -> None:
    got = ep.load()
    if callable(got) and not isinstance(got, types.ModuleType):
        got()


def _module_of(ep: Any) -> str:
    return ep.value.partition(":")[0].strip()


def load_plugins(modules: Iterable[str] = ()) -> None:
    """Imports the installed packages' ``steersman.plugins`` entry points (each once a process: one that failed is
    tried again next time) and then ``modules`` (dotted names), whose imports register their plugins.  An entry point
    naming a callable rather than a module is called with no arguments once loaded.  :class:`PluginLoadError` names
    what failed (a module calling ``sys.exit`` included), and what it had registered is rolled back."""
    with _LOCK:
        _load(modules)


def _load(modules: Iterable[str]) -> None:
    global _scanned
    for ep in () if _scanned else entry_points(group=ENTRY_POINT_GROUP):
        if (ep.name, ep.value) in _loaded:
            continue
        try:
            _rolled_back(lambda: _entry_point(ep), also=_module_of(ep))
        except (Exception, SystemExit) as e:  # noqa: BLE001 -- a third party's import raises what it raises
            raise PluginLoadError(f"entry point {ep.name!r} ({ep.value}) of group {ENTRY_POINT_GROUP!r} "
                                  f"failed to load: {type(e).__name__}: {e}") from None
        _loaded.add((ep.name, ep.value))
    _scanned = True  # (not reached past a failure: the next load scans again and retries it)
    for name in modules:
        if not isinstance(name, str) or not name.strip():
            raise PluginLoadError(f"plugins: each entry must be a module's dotted name, got {name!r}")
        try:
            _rolled_back(lambda: importlib.import_module(name))
        except (Exception, SystemExit) as e:  # noqa: BLE001
            raise PluginLoadError(f"plugins: module {name!r} failed to import: {type(e).__name__}: {e}") from None
