"""Helpers for declaring settings: every default is written once, with its source."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

__all__ = ["setting", "sources", "check_bounds", "bounds_text", "value_ranges", "finite_number", "shown", "yaml_kind"]

#: a bound: a number, or the name of another field of the same settings (``le="limit_max"``)
Bound = float | str | None


def finite_number(v: int | float) -> bool:
    """``v`` is a finite float, or an int a float holds (YAML reads any run of digits as an int, and
    ``math.isfinite(10**400)`` raises OverflowError)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def shown(value: Any, limit: int = 80) -> str:
    """``value`` as an error message shows it: the repr of a scalar, cut to about ``limit`` characters; a collection
    only by its kind (the repr of a YAML anchor/alias chain of 700 bytes is hundreds of millions of items long, and
    Python refuses to print an integer past 4,300 digits)."""
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() < 64:
            return repr(value)
        if value.bit_length() < 14_000:  # str() refuses past 4,300 digits (sys.set_int_max_str_digits)
            return f"a {len(str(abs(value)))}-digit integer"
        return f"an integer of {value.bit_length():,} bits"
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value):,} characters)"
    return yaml_kind(value)


def yaml_kind(value: Any) -> str:
    """How a value of the wrong type is named in an error: its YAML kind."""
    return {type(None): "null", str: "a string", dict: "a mapping", list: "a list", tuple: "a list", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def setting(default: Any, source: str, *, ge: Bound = None, gt: Bound = None, le: Bound = None,
            lt: Bound = None) -> Any:
    """A dataclass field whose default carries the reason it has that value, and, for a number, the values it
    may take: ``ge`` / ``gt`` / ``le`` / ``lt`` (a number with no lower bound given must be >= 0; always finite).
    A bound may name another field of the same settings instead (``le="limit_max"``), checked once every field is
    within its numeric bounds.  The class's ``__post_init__`` calls :func:`check_bounds`, so a value from a fleet
    file or a flag outside them is refused, and ``steersman defaults`` prints them (:func:`bounds_text`)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("settings are frozen: use tuples / MappingProxyType for collections")
    meta: dict[str, Any] = {"source": source}
    for key, bound in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)):
        if bound is not None:
            meta[key] = bound
    if getattr(default, "__hash__", None) is None:  # a read-only mapping: shared, never copied
        return dataclasses.field(default_factory=lambda: default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _bounds(f: dataclasses.Field) -> tuple[Bound, Bound, Bound, Bound]:
    """``(ge, gt, le, lt)`` of a setting (``ge`` 0 when it gives no lower bound); each a number, a field's name,
    or None."""
    m = f.metadata
    ge, gt = m.get("ge"), m.get("gt")
    if ge is None and gt is None:
        ge = 0
    return ge, gt, m.get("le"), m.get("lt")


def _b(bound: float | str) -> str:
    return bound if isinstance(bound, str) else f"{bound:g}"


def bounds_text(f: dataclasses.Field) -> str:
    """The values a numeric setting may take, e.g. ``> 0``, ``0 to 1``, ``>= 0, < 1``, ``>= 1, <= limit_max``
    (``steersman defaults`` prints it)."""
    ge, gt, le, lt = _bounds(f)
    low = f">= {_b(ge)}" if ge is not None else f"> {_b(gt)}"
    if le is None and lt is None:
        return low
    if ge is not None and le is not None and lt is None and not isinstance(ge, str) and not isinstance(le, str):
        return f"{ge:g} to {le:g}"
    highs = [f"<= {_b(le)}" if le is not None else "", f"< {_b(lt)}" if lt is not None else ""]
    return ", ".join([low, *filter(None, highs)])


#: an integer setting fits a signed 64-bit integer: what numpy arrays, msgspec and Redis take
_INT64 = 2**63

_OUTSIDE = {"ge": (lambda v, b: v < b, ">="), "gt": (lambda v, b: v <= b, ">"),
            "le": (lambda v, b: v > b, "<="), "lt": (lambda v, b: v >= b, "<")}


def check_bounds(obj: Any) -> None:
    """ValueError, naming the field, for a number of the settings ``obj`` that is not finite or outside its bounds
    (see :func:`setting`), or an integer past 64 bits.  ``None`` (unset) and booleans are not numbers here.
    The bounds naming another field are checked after every field's own, naming both and the other's value
    (``limit_min must be <= limit_max (10), got 100``)."""
    numbers = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, int) and not -_INT64 <= v < _INT64:  # (math.isfinite(10**400) raises OverflowError)
            raise ValueError(f"{f.name} must be {bounds_text(f)} (a 64-bit integer), got {shown(v)}")
        if not math.isfinite(v):
            raise ValueError(f"{f.name} must be a finite number {bounds_text(f)}, got {v!r}")
        for key, bound in zip(("ge", "gt", "le", "lt"), _bounds(f)):
            if bound is not None and not isinstance(bound, str) and _OUTSIDE[key][0](v, bound):
                raise ValueError(f"{f.name} must be {bounds_text(f)}, got {v!r}")
        numbers.append((f, v))
    refs = {f.name: [b for b in _bounds(f) if isinstance(b, str)] for f, _ in numbers}
    # a bound on a field that is itself bound by another is checked last: limit_min <= limit_max is said before
    # limit_initial >= limit_min, when limit_min > limit_max puts limit_initial outside one of them too
    for f, v in sorted(numbers, key=lambda fv: sum(bool(refs.get(b)) for b in refs[fv[0].name])):
        for key, bound in zip(("ge", "gt", "le", "lt"), _bounds(f)):
            if not isinstance(bound, str):
                continue
            other = getattr(obj, bound)
            if isinstance(other, (int, float)) and not isinstance(other, bool) and _OUTSIDE[key][0](v, other):
                raise ValueError(f"{f.name} must be {_OUTSIDE[key][1]} {bound} ({_g(other)}), got {_g(v)}")


def _g(v: float) -> str:
    """A number as written in a fleet file: ``10`` for 10.0, else its repr."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() and abs(v) < 1e15 else repr(v)


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


def _follow(settings: Any, fields: dict[str, dataclasses.Field], changes: dict[str, Any]) -> None:
    """Move the fields ``changes`` does not set to the bounds a field it sets puts on them (see :func:`override`)."""
    given = set(changes)
    for _ in range(len(fields)):  # a chain (limit_initial within [limit_min, limit_max]) settles in a few passes
        moved = False
        for f in fields.values():
            for key, bound in zip(("ge", "gt", "le", "lt"), _bounds(f)):
                if not isinstance(bound, str) or f.name in given or bound not in given:
                    continue  # a number; a field written (checked as written); a bound left at its default
                v, other = changes.get(f.name, getattr(settings, f.name)), changes.get(bound, getattr(settings, bound))
                if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (v, other)):
                    continue
                if not _OUTSIDE[key][0](v, other):
                    continue
                changes[f.name] = type(getattr(settings, f.name))(other)  # (ge/le: to it)
                moved = True
        if not moved:
            return


def override(settings: Any, data: Any, where: str) -> Any:
    """A copy of the frozen ``settings`` with the fields in ``data`` (a mapping) replaced.

    Unknown fields and wrong types raise ``ValueError`` naming ``where.field``.  A field bounded by another
    (``limit_initial <= limit_max``) that ``data`` leaves at its default while it sets the other follows it to the
    bound (a file with ``limit_max: 16`` gets ``limit_initial`` 16, not an error about a key it never wrote); a field
    ``data`` sets outside a bound is an error naming it, whether the other was written or not.
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
    _follow(settings, fields, changes)
    try:
        return dataclasses.replace(settings, **changes)  # the class's __post_init__ checks the values
    except ValueError as e:
        msg = str(e)
        field = msg.split(" ", 1)[0].rstrip(":")
        raise ValueError(f"{where}.{msg}" if field in fields else f"{where}: {msg}") from None
