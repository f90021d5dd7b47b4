"""Helpers for declaring settings: every default is written once, with its source."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["setting", "sources"]


def setting(default: Any, source: str) -> Any:
    """A dataclass field whose default carries the reason it has that value."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("settings are frozen: use tuples / MappingProxyType for collections")
    if getattr(default, "__hash__", None) is None:  # a read-only mapping: shared, never copied
        return dataclasses.field(default_factory=lambda: default, metadata={"source": source})
    return dataclasses.field(default=default, metadata={"source": source})


def sources(obj: Any, prefix: str = "") -> dict[str, tuple[Any, str]]:
    """Flatten a settings tree to ``{"section.field": (value, source)}``."""
    out: dict[str, tuple[Any, str]] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out.update(sources(value, name + "."))
        else:
            out[name] = (value, f.metadata.get("source", ""))
    return out


def override(settings: Any, data: Any, where: str) -> Any:
    """A copy of the frozen ``settings`` with the fields in ``data`` (a mapping) replaced.

    Unknown fields and wrong types raise ``ValueError`` naming ``where.field``.
    """
    import msgspec

    if data is None:
        return settings
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(settings)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {unknown}; known: {sorted(fields)}")
    changes = {}
    for name, value in data.items():
        current = getattr(settings, name)
        try:
            changes[name] = msgspec.convert(value, type(current) if current is not None else Any, strict=False)
        except msgspec.ValidationError as e:
            raise ValueError(f"{where}.{name}: {e}") from None
    return dataclasses.replace(settings, **changes)
