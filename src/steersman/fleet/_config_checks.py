"""The fleet file's plumbing: its error, YAML without duplicate keys, and the custom scheduling profiles' checks
(each profile item's shape, each plugin built alone as the profile builds it), apart from
:mod:`steersman.fleet.config` so each stays small."""

from __future__ import annotations

from typing import Any

import yaml

from steersman.config import SchedulerSettings
from steersman.config._base import finite_number

__all__ = ["FleetConfigError", "load_yaml", "make_profile"]


class FleetConfigError(ValueError):
    pass


def make_profile(name: str, spec: dict, settings: SchedulerSettings):
    """A custom profile from its fleet-file form (see :func:`steersman.policy.framework.build`)."""
    from steersman.policy.framework import build
    from steersman.policy.saturation import Saturation

    return build(name, spec, Saturation(settings), settings=settings)


def _profiles(data: Any, where: str) -> dict[str, dict]:
    """The custom profiles as written, each checked for its shape (lists, plugin items, types) so that a typo is an
    error naming ``profiles.<name>.<field>``, not a key silently ignored or a string iterated letter by letter."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FleetConfigError(f"{where} must map profile names to {{filters, scorers, picker, queue_when_saturated}}")
    for name, spec in data.items():
        at = f"{where}.{name}"
        if not isinstance(spec, dict):
            raise FleetConfigError(f"{at} must be a mapping {{filters, scorers, picker, queue_when_saturated}}, "
                                   f"got {_kind(spec)}")
        unknown = set(spec) - {"filters", "scorers", "picker", "queue_when_saturated"}
        if unknown:
            raise FleetConfigError(f"{at}: unknown field(s) {sorted(map(str, unknown))}")
        for key in ("filters", "scorers"):
            items = spec.get(key, [])
            if not isinstance(items, list):
                raise FleetConfigError(f"{at}.{key} must be a list of plugins (a name or {{type, weight, params}}), "
                                       f"got {_kind(items)}")
            for i, item in enumerate(items):
                _plugin_item(item, f"{at}.{key}[{i}]", weighted=key == "scorers")
        if "picker" in spec:
            _plugin_item(spec["picker"], f"{at}.picker", weighted=False)
        if not isinstance(spec.get("queue_when_saturated", False), bool):
            raise FleetConfigError(f"{at}.queue_when_saturated must be true or false, got "
                                   f"{spec['queue_when_saturated']!r}")
    return {str(k): v for k, v in data.items()}


def _plugin_item(item: Any, at: str, weighted: bool) -> None:
    """A plugin as a profile names it: ``name``, or ``{type, params}`` (a scorer also ``weight``)."""
    if isinstance(item, str):
        return
    if not isinstance(item, dict):
        raise FleetConfigError(f"{at} must be a plugin name or a mapping {{type, ...}}, got {_kind(item)}")
    known = ("type", "weight", "params") if weighted else ("type", "params")
    unknown = set(item) - set(known)
    if unknown:
        raise FleetConfigError(f"{at}: unknown field(s) {sorted(map(str, unknown))}; known: {', '.join(known)}")
    if not isinstance(item.get("type"), str):
        raise FleetConfigError(f"{at}.type must name the plugin, got {_kind(item.get('type'))}")
    w = item.get("weight", 1.0)
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not (finite_number(w) and w >= 0):
        raise FleetConfigError(f"{at}.weight must be a finite number >= 0, got {w!r}")
    params = item.get("params")
    if params is not None and not (isinstance(params, dict) and all(isinstance(k, str) for k in params)):
        raise FleetConfigError(f"{at}.params must map the plugin's parameter names to values, got {_kind(params)}")


def _check_plugins(spec: dict, where: str, settings: SchedulerSettings) -> None:
    """Each plugin of a (shape-checked) profile built alone, as the profile builds it
    (:func:`~steersman.policy.framework.make_plugin`, with the fleet file's scheduler ``settings``): whatever its
    constructor raises (a parameter it refuses, or one of the wrong type) names the item."""
    from steersman.policy.framework import FILTERS, PICKERS, SCORERS, make_plugin

    named = [(f"{key}[{i}]", reg, item) for key, reg in (("filters", FILTERS), ("scorers", SCORERS))
             for i, item in enumerate(spec.get(key, ()))]
    named.append(("picker", PICKERS, spec.get("picker", "max-score")))
    for at, reg, item in named:
        kind = item if isinstance(item, str) else item["type"]
        try:
            make_plugin(reg, item, settings)
        except KeyError as e:  # an unknown name (UnknownPlugin lists the known ones)
            raise FleetConfigError(f"{where}.{at}: {e}") from None
        except ValueError as e:  # make_plugin names the plugin: what it refused follows its name
            raise FleetConfigError(f"{where}.{at} ({kind}): {str(e).split(': ', 1)[-1]}") from None


def _kind(value: Any) -> str:
    """How a value of the wrong type is named in an error: its YAML kind."""
    return {type(None): "null", str: "a string", dict: "a mapping", list: "a list", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader refusing a key given twice in one mapping (PyYAML keeps the last one: a second
    ``gateway:`` section silently replaced the first)."""

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


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, but a key given twice in a mapping is an error (a ``yaml.YAMLError``) naming it."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader subclass
