"""Helpers for declaring settings: every default is written once, with its source."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["setting", "sources"]


def setting(default: Any, source: str) -> Any:
    """A dataclass field whose default carries the reason it has that value."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("settings are frozen: use tuples / mappingproxy for collections")
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
