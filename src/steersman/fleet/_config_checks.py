"""The fleet file's plumbing: its error, its YAML loader (:func:`steersman.config._yaml.load_yaml`, without duplicate
keys, YAML 1.2 numbers; re-exported here), the custom scheduling profiles' checks (each profile item's shape, each
plugin built alone as the profile builds it), and the checks across endpoints and sections (an engine listed twice,
replica names that collide once generated, an endpoint's URL and tensor parallelism, the queue against brown-out),
apart from :mod:`steersman.fleet.config` so each stays small."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from steersman.config import DEFAULTS, AdmissionSettings, ReliabilitySettings, SchedulerSettings
from steersman.config._base import finite_number, shown, yaml_kind
from steersman.config._urls import http_url_problem
from steersman.config._yaml import load_yaml  # re-exported (shared with workload specs, tenants files)

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
                                   f"{shown(spec['queue_when_saturated'])}")
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
        raise FleetConfigError(f"{at}.weight must be a finite number >= 0, got {shown(w)}")
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


_kind = yaml_kind  # (the settings' own errors name kinds the same way)


# ---- checks across endpoints and sections ------------------------------------------------------------------------

def endpoint_url_problem(url: str) -> str | None:
    """Why the gateway could not use ``url`` as an engine's base URL (what :meth:`steersman.http.client.Endpoint.parse`
    reads: scheme, host, port, and a path the adapters add ``/v1/...`` and ``/metrics`` to)."""
    problem = http_url_problem(url)
    if problem is not None:
        return problem
    u = urlsplit(url)
    if u.username is not None or u.password is not None:
        return ("has credentials (user:password@): the gateway sends an engine none (they would go out in its Host "
                "header) and shows the URL in /admin/fleet")
    if u.query or u.fragment:
        return "has a query string or fragment: the gateway drops it (it adds its own paths to the URL's)"
    if u.path.rstrip("/").endswith("/v1"):
        return ("ends in /v1: give the engine's base URL, without /v1 (the gateway adds /v1/chat/completions ... "
                "and scrapes /metrics beside it: every request and scrape would 404)")
    return None


def engine_key(url: str) -> tuple[str, str, int, str]:
    """What makes two endpoint URLs (each passing :func:`endpoint_url_problem`) the same engine: scheme, host,
    port (80 / 443 when none is given) and path without its trailing slash (``localhost`` and ``127.0.0.1`` stay
    apart: two names may well be two engines behind a proxy)."""
    u = urlsplit(url)
    return u.scheme, (u.hostname or "").lower(), u.port or (443 if u.scheme == "https" else 80), u.path.rstrip("/")


def check_same_engines(urls: list[str], where: str) -> None:
    """FleetConfigError for an engine listed twice: its replica would be counted (routed to, priced) twice."""
    seen: dict[tuple, int] = {}
    for i, url in enumerate(urls):
        first = seen.setdefault(engine_key(url), i)
        if first != i:
            raise FleetConfigError(f"{where}: endpoints[{i}].url: the same engine as endpoints[{first}] "
                                   f"({shown(urls[first])}); list each engine once")


def check_names(named: list[tuple[str, str, str, str]], where: str) -> None:
    """FleetConfigError for two replicas under one name once the unnamed ones have theirs.  ``named``: each
    replica's (name, the key that gives it, the replica as the error names it, how its name is made), in the
    gateway's order.  A replica's name is its identity: metrics, logs, ejections, /admin/fleet."""
    first: dict[str, tuple[str, str]] = {}
    for name, key, owner, how in named:
        if name in first:
            owner0, how0 = first[name]
            raise FleetConfigError(f"{where}: {key}: {shown(name)} ({how}) is already the name of {owner0} ({how0}): "
                                   "a replica's name is its identity (metrics, logs, ejections); name one otherwise")
        first[name] = (owner, how)


def check_endpoint_tp(tp: int, gpu: str | None, model: str | None, at: str, engine: str = "vllm") -> None:
    """An endpoint's ``tp`` within the bounds a simulated replica's engine has (``engine.tensor_parallel``: >= 1, a
    64-bit integer), and, for a known GPU and model, one vLLM can split the model over (at most its attention heads,
    as a simulated replica's); not for llama.cpp, which splits a model over GPUs by layers or rows."""
    from steersman.sim import gpu_profile, model_profile
    from steersman.sim.memory import check_tensor_parallel

    if tp < 1:
        raise FleetConfigError(f"{at}.tp must be >= 1, got {tp}")
    try:
        replace(DEFAULTS.engine, tensor_parallel=tp)
    except ValueError as e:  # "tensor_parallel must be >= 1, got a 20-digit integer"
        raise FleetConfigError(f"{at}.tp {str(e).removeprefix('tensor_parallel ')}") from None
    if not (gpu and model) or engine == "llamacpp":
        return
    try:
        gpu_profile(gpu)
        profile = model_profile(model)
    except KeyError:
        return  # no profile: the gateway does not model it, nothing to split
    try:
        check_tensor_parallel(profile, tp)
    except ValueError as e:
        raise FleetConfigError(f"{at}.tp: {e} ({model} on {tp} x {gpu})") from None


def check_queue_reaches_brownout(admission: AdmissionSettings, reliability: ReliabilitySettings, named: bool,
                                 where: str) -> None:
    """FleetConfigError when the fleet file configures brown-out (``named``: it gives brownout_queue_depth or
    brownout_models) and the gateway queue is shorter than the backlog that begins it: brown-out could never
    begin.  (With brown-out left at its defaults a short queue is accepted: what it would do, shed sheddable
    requests first, the full queue does.)"""
    depth, cap = reliability.brownout_queue_depth, admission.queue_max_entries
    if named and cap < depth:
        raise FleetConfigError(f"{where}: admission.queue_max_entries ({cap}) is below reliability.brownout_queue_depth "
                               f"({depth}): brown-out begins at that many queued requests for a model, which the queue "
                               "never holds; lower brownout_queue_depth or raise queue_max_entries")


def check_prefix_budget(scheduler: SchedulerSettings, replicas: int, where: str) -> None:
    """FleetConfigError when ``scheduler.prefix_index_max_mib`` is too small for the fleet's replicas (the index
    would refuse it at start).  The least is the index's own: what it says when given no budget at all, before it
    allocates anything (so a twin fleet of a million replicas costs nothing here)."""
    import re

    from steersman.fleet.prefix_index import PrefixIndex

    if replicas < 1:
        return
    try:
        PrefixIndex(replicas, 0.0)
    except ValueError as e:
        least = re.search(r"at least ([0-9.]+) MiB", str(e))
    else:
        least = None
    if least is not None and scheduler.prefix_index_max_mib < float(least.group(1)):
        raise FleetConfigError(f"{where}: scheduler.prefix_index_max_mib must be at least {least.group(1)} MiB for "
                               f"{replicas:,} replicas, got {scheduler.prefix_index_max_mib:g}")


def resolve_policy(policy: str | None, profile: str | None, where: str) -> tuple[str, str]:
    """The routing profile, and the key that names it: ``policy:`` and ``scheduler.profile`` are one setting (the
    scheduler's field the gateway reads as ``policy``): either names it; both must agree."""
    if policy is not None and profile is not None and policy != profile:
        raise FleetConfigError(f"{where}: scheduler.profile {shown(profile)} and policy {shown(policy)} differ: both "
                               "name the routing profile; give one")
    if policy is not None:
        return policy, "policy"
    if profile is not None:
        return profile, "scheduler.profile"
    return DEFAULTS.scheduler.profile, "policy"


def check_named_plugins(admission: AdmissionSettings, gateway: Any, where: str) -> None:
    """``admission.admitter`` names a registered admitter that builds (made once now: a typo fails at startup); shared
    limits (``gateway.limits_url``) need one that keeps :class:`~steersman.control.DefaultAdmitter`'s buckets;
    ``gateway.response_store`` (``gateway``: GatewaySettings), when set, names a registered store."""
    from steersman.control.admission import ADMITTERS, DefaultAdmitter, make_admitter

    if admission.admitter not in ADMITTERS:
        raise FleetConfigError(f"{where}: unknown admission.admitter {shown(admission.admitter)}; "
                               f"known: {', '.join(ADMITTERS.names())}")
    try:
        made = make_admitter(admission)
    except Exception as e:  # noqa: BLE001 -- a plugin's own checks raise what they raise
        raise FleetConfigError(f"{where}: admission.admitter {shown(admission.admitter)}: {e}") from None
    if gateway.limits_url and not isinstance(made, DefaultAdmitter):
        raise FleetConfigError(
            f"{where}: gateway.limits_url shares the default admitter's token buckets and spend through Redis, but "
            f"admission.admitter {shown(admission.admitter)} ({type(made).__name__}) keeps none: leave out "
            "limits_url or use an admitter derived from DefaultAdmitter")
    from steersman.api.response_store import RESPONSE_STORES

    if gateway.response_store is not None and gateway.response_store not in RESPONSE_STORES:
        raise FleetConfigError(f"{where}: unknown gateway.response_store {shown(gateway.response_store)}; "
                               f"known: {', '.join(RESPONSE_STORES.names())}")
