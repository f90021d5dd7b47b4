"""Helpers for declaring settings: every default is written once, with its source."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

__all__ = ["setting", "sources", "check_bounds", "bounds_text", "value_ranges", "finite_number"]


def finite_number(v: int | float) -> bool:
    """``v`` is a finite float, or an int a float holds (YAML reads any run of digits as an int, and
    ``math.isfinite(10**400)`` raises OverflowError)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def setting(default: Any, source: str, *, ge: float | None = None, gt: float | None = None,
            le: float | None = None) -> Any:
    """A dataclass field whose default carries the reason it has that value, and, for a number, the values it
    may take: ``ge`` / ``gt`` / ``le`` (a number with no bound given must be >= 0; always finite).  The class's
    ``__post_init__`` calls :func:`check_bounds`, so a value from a fleet file or a flag outside them is refused."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("settings are frozen: use tuples / MappingProxyType for collections")
    meta: dict[str, Any] = {"source": source}
    for key, bound in (("ge", ge), ("gt", gt), ("le", le)):
        if bound is not None:
            meta[key] = bound
    if getattr(default, "__hash__", None) is None:  # a read-only mapping: shared, never copied
        return dataclasses.field(default_factory=lambda: default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _bounds(f: dataclasses.Field) -> tuple[float | None, float | None, float | None]:
    m = f.metadata
    ge, gt = m.get("ge"), m.get("gt")
    if ge is None and gt is None:
        ge = 0
    return ge, gt, m.get("le")


def bounds_text(f: dataclasses.Field) -> str:
    """The values a numeric setting may take, e.g. ``> 0``, ``0 to 1`` (``steersman defaults`` prints it)."""
    ge, gt, le = _bounds(f)
    low = f">= {ge:g}" if ge is not None else f"> {gt:g}"
    if le is None:
        return low
    return f"{ge:g} to {le:g}" if ge is not None else f"{low}, <= {le:g}"


#: an integer setting fits a signed 64-bit integer: what numpy arrays, msgspec and Redis take
_INT64 = 2**63


def check_bounds(obj: Any) -> None:
    """ValueError, naming the field, for a number of the settings ``obj`` that is not finite or outside its bounds
    (see :func:`setting`), or an integer past 64 bits.  ``None`` (unset) and booleans are not numbers here."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, int) and not -_INT64 <= v < _INT64:  # (math.isfinite(10**400) raises OverflowError)
            raise ValueError(f"{f.name} must be {bounds_text(f)}, got a {len(str(abs(v)))}-digit integer")
        ge, gt, le = _bounds(f)
        if not math.isfinite(v):
            raise ValueError(f"{f.name} must be a finite number {bounds_text(f)}, got {v!r}")
        if (ge is not None and v < ge) or (gt is not None and v <= gt) or (le is not None and v > le):
            raise ValueError(f"{f.name} must be {bounds_text(f)}, got {v!r}")


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


def value_ranges(obj: Any, prefix: str = "") -> dict[str, str]:
    """``{"section.field": "> 0"}`` for every numeric setting of a settings tree (:func:`bounds_text`)."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(value_ranges(value, f"{prefix}{f.name}."))
        elif f.type in ("int", "float", "int | None", "float | None") or (
                isinstance(value, (int, float)) and not isinstance(value, bool)):
            out[f"{prefix}{f.name}"] = bounds_text(f)
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
    hints = typing.get_type_hints(type(settings))  # the declared types: a field whose default is None still has one
    changes = {}
    for name, value in data.items():
        try:
            changes[name] = msgspec.convert(value, hints.get(name, Any), strict=False)
        except msgspec.ValidationError as e:
            raise ValueError(f"{where}.{name}: {e}") from None
    try:
        return dataclasses.replace(settings, **changes)  # the class's __post_init__ checks the values
    except ValueError as e:
        msg = str(e)
        field = msg.split(" ", 1)[0].rstrip(":")
        raise ValueError(f"{where}.{msg}" if field in fields else f"{where}: {msg}") from None
