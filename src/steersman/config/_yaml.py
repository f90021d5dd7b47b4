"""The YAML every file a user writes is read with (the fleet file, a workload spec, a tenants file): PyYAML's safe
loader refusing a key given twice in one mapping, and reading numbers as YAML 1.2 does (:func:`load_yaml`).

Here, apart from the fleet file's checks, so that the twin's workload specs and the control plane's tenants file
read their YAML exactly as the fleet file does without importing :mod:`steersman.fleet`."""

from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = ["load_yaml"]


_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_INT = re.compile(r"^(?:[-+]?[0-9][0-9_]*|[-+]?0o[0-7]+|[-+]?0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                    r"|\.(?:nan|NaN|NAN))$")


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader refusing a key given twice in one mapping (PyYAML keeps the last one: a second
    ``gateway:`` section silently replaced the first), and reading numbers as YAML 1.2 does (PyYAML is YAML 1.1:
    ``port: 1:30`` was 90, base 60, ``port: 010`` was 8, octal, and ``1e-3`` a string some sections took and others
    refused).  Decimal integers (``_`` between digits allowed), ``0o`` octal, ``0x`` hex; floats with an exponent
    with or without a dot.  Booleans as before, YAML 1.1's (``yes``/``no``/``on``/``off`` too, not strings as in
    YAML 1.2): a file's ``enabled: yes`` keeps its meaning; a name spelt so is quoted (``keys create`` quotes it)."""

    yaml_implicit_resolvers = {k: [(tag, rx) for tag, rx in v if tag not in (_INT_TAG, _FLOAT_TAG)]
                               for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class says so
                    continue
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} on line {line} (first given on line {first})",
                        key_node.start_mark)
                seen[key] = line
        return super().construct_mapping(node, deep)


    def construct_yaml_int(self, node):
        value = self.construct_scalar(node).replace("_", "")
        try:
            if value.lstrip("+-").startswith(("0o", "0x")):
                sign = -1 if value.startswith("-") else 1
                digits = value.lstrip("+-")
                return sign * int(digits[2:], 8 if digits[1] == "o" else 16)
            return int(value, 10)
        except ValueError:  # int() refuses a string of more than 4,300 digits (sys.get_int_max_str_digits)
            raise yaml.constructor.ConstructorError(
                None, None, f"a number of {len(node.value):,} characters on line {node.start_mark.line + 1}: too long "
                "to be a setting", node.start_mark) from None


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)


for _first in "-+0123456789":  # YAML 1.2 core schema's int and float, as a YAML 1.2 parser reads a fleet file
    _UniqueKeyLoader.add_implicit_resolver(_INT_TAG, _INT, list(_first))
    _UniqueKeyLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list(_first))
_UniqueKeyLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("."))


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, but a key given twice in a mapping is an error (a ``yaml.YAMLError``) naming it, and
    numbers are read as YAML 1.2 reads them (see :class:`_UniqueKeyLoader`).  Every file a user writes is read with
    it: the fleet file, a workload spec (``simulate`` / ``plan --workload``), a tenants file."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader subclass
