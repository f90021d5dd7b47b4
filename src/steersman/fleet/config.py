"""The fleet file (YAML): gateway settings, engine endpoints, an embedded simulated fleet.

```yaml
plugins: [acme_routing]                        # modules imported first: their filters, scorers, admitters... register
gateway: {host: 127.0.0.1, port: 8080}       # any GatewaySettings field
policy: steersman                              # a registered routing profile (or scheduler.profile: the same)
scheduler:                                     # any SchedulerSettings field, SLO classes, custom profiles
  saturation_queue_depth: 5
  slo_classes: {interactive: {ttft_s: 0.45, tpot_s: 0.04}, standard: {ttft_s: 2.0, tpot_s: 0.2}, batch: {}}
  profiles:                                    # then `policy: mine`
    mine: {filters: [shortlist, fits-kv], scorers: [{type: prefix-affinity, weight: 3}, {type: load-balance, weight: 1}],
           picker: max-score, queue_when_saturated: true}
admission: {queue_max_entries: 1024}          # any AdmissionSettings field (admitter: a registered name)
reliability: {consecutive_failures: 5, brownout_models: {llama-3.1-70b: llama-3.1-8b}}   # any ReliabilitySettings field
tenants:                                       # with no api_keys the gateway runs open
  acme: {priority: critical, requests_per_minute: 600, tokens_per_minute: 200000, budget_usd: 50}
api_keys:                                      # SHA-256 of each key (`steersman keys create`)
  - {sha256: "<64 hex>", tenant: acme}
endpoints:                                     # engines already running
  - {name: h100-0, url: "http://10.0.0.5:8000", engine: vllm, gpu: H100, models: [llama-3.1-8b], pool: main}
    # kv_events: "tcp://10.0.0.5:5557"   # the engine's KV events (vLLM --kv-events-config): exact prefix matches
    # kv_events_replay: "tcp://10.0.0.5:5558"   # its replay_endpoint: what a gap or a late start missed
  - {name: cpu-0, url: "http://10.0.0.6:8080", engine: llamacpp, kv_unified: true}   # llama-server -kvu (or no -np)
  # - {url: "http://10.0.0.7:8000", engine: vllm, models: [llama-3.1-8b], lora_modules: [sql-lora]}   # --lora-modules
simulated:                                     # engine-sim replicas started for you
  speedup: 1.0
  replicas:
    - {gpu: H100, model: llama-3.1-8b, count: 2}
  # digital twin only (`steersman simulate`): prefill/decode disaggregation -- role: prefill | decode | both
  # (default both); KV moves over kv_link_gbit_s (default engine.kv_link_gbit_s) to the decode replica that
  # scheduler.decode_picker chooses (default least-loaded). The live gateway ignores role.
  # replicas: [{gpu: H100, model: llama-3.1-8b, count: 2, role: prefill}, {..., role: decode}]
  # kv_link_gbit_s: 400
```
Upstream URLs come from this file only; requests cannot name them.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType
from pathlib import Path
from typing import Any

import msgspec
import yaml

from steersman.config import DEFAULTS, AdmissionSettings, GatewaySettings, ReliabilitySettings, SchedulerSettings, SloClass
from steersman.config._base import finite_number, override, shown
from steersman.config._urls import http_url_problem
from steersman.control.tenants import TenantConfigError, TenantDirectory, TenantsDoc
from steersman.plugins import PluginLoadError, load_plugins
from steersman.sim import gpu_profile, model_profile, replica_capacity
from steersman.fleet._config_checks import (FleetConfigError, _check_plugins, _kind, _profiles, check_endpoint_tp,
                                            check_named_plugins, check_names, check_prefix_budget, check_queue_reaches_brownout,
                                            check_same_engines, endpoint_url_problem, load_yaml, make_profile,
                                            resolve_policy)
from steersman.sim.memory import check_tensor_parallel

__all__ = ["EndpointConfig", "SimReplicaConfig", "SimulatedFleetConfig", "FleetConfig", "load_fleet", "parse_fleet", "FleetConfigError",
           "sim_replica_names", "endpoint_name"]


_SCHEDULING = ("fcfs", "priority")  # vLLM SchedulerConfig.policy values


class EndpointConfig(msgspec.Struct, forbid_unknown_fields=True):
    url: str
    name: str | None = None
    engine: str = "openai"
    gpu: str | None = None
    models: list[str] = msgspec.field(default_factory=list)
    pool: str = "default"
    price_per_hour: float | None = None
    tp: int = 1
    #: "priority": the engine runs vLLM's --scheduling-policy priority and takes a per-request ``priority``
    #: (steersman sends control.accounting.engine_priority); "fcfs" (vLLM's default): none is sent
    scheduling: str = "fcfs"
    #: the engine's KV events (vLLM --kv-events-config, ZMQ publisher): the gateway subscribes here and takes the
    #: replica's prefix match from them (steersman.engines.kv_events); None: the approximate index
    kv_events: str | None = None
    kv_events_topic: str = ""  # vLLM KVEventsConfig.topic default
    #: the engine's replay socket (vLLM KVEventsConfig.replay_endpoint): batches missed in a gap, or published
    #: before the gateway joined, are asked for again; None: they stay missed
    kv_events_replay: str | None = None
    #: llama.cpp only: the llama-server's slots share one KV pool (--kv-unified, or -np left to auto), false: one
    #: pool per slot (-np N); its pages cannot tell (each slot reports the shared pool as its n_ctx).  None: the
    #: adapter reads the smallest pool the slots allow until they show more (steersman.engines.llamacpp)
    kv_unified: bool | None = None
    #: LoRA adapters the engine serves besides ``models`` (vLLM --lora-modules NAME=PATH, SGLang --lora-paths):
    #: requested by name, their KV kept apart from the base model's and from each other's (vLLM hashes the adapter
    #: into every block), so the prefix index keys their prompts apart (steersman.text.lora).  Found in ``/v1/models``
    #: (an entry with a ``parent``) when ``models`` is not given.  A name is an adapter on every endpoint serving it.
    lora_modules: list[str] = msgspec.field(default_factory=list)
    #: the model profile (``steersman.sim``) the latency model sizes this replica with, where the engine serves it
    #: under another name (vLLM --served-model-name); None: ``models[0]``
    model_profile: str | None = None


class SimReplicaConfig(msgspec.Struct, forbid_unknown_fields=True):
    gpu: str
    model: str
    count: int = 1
    tp: int = 1
    pool: str = "default"
    served_model_name: str | None = None
    cold_start: bool = False
    role: str = "both"  # digital twin: prefill | decode | both (prefill/decode disaggregation)
    scheduling: str = "fcfs"  # the engine's scheduling policy: fcfs | priority (see EndpointConfig.scheduling)
    #: adapters served too (EndpointConfig.lora_modules; engine-sim --lora-modules); the twin ignores them
    lora_modules: list[str] = msgspec.field(default_factory=list)


class SimulatedFleetConfig(msgspec.Struct, forbid_unknown_fields=True):
    replicas: list[SimReplicaConfig]
    speedup: float = DEFAULTS.sim_server.speedup
    kv_link_gbit_s: float | None = None  # digital twin: KV transfer link (None: DEFAULTS.engine.kv_link_gbit_s)
    otlp_traces_endpoint: str | None = None  # each engine-sim exports its llm_request spans there (as vLLM's flag)


class _FleetFile(msgspec.Struct, forbid_unknown_fields=True):
    plugins: list[Any] = msgspec.field(default_factory=list)  # modules to import first: their plugins register
    gateway: dict[str, Any] = msgspec.field(default_factory=dict)
    policy: str | None = None  # or scheduler.profile: one setting (None: neither, DEFAULTS.scheduler.profile)
    scheduler: dict[str, Any] = msgspec.field(default_factory=dict)
    admission: dict[str, Any] = msgspec.field(default_factory=dict)
    reliability: dict[str, Any] = msgspec.field(default_factory=dict)
    tenants: dict[str, Any] | None = None
    api_keys: list[Any] | None = None
    endpoints: list[EndpointConfig] = msgspec.field(default_factory=list)
    simulated: SimulatedFleetConfig | None = None


class FleetConfig(msgspec.Struct, frozen=True):
    gateway: GatewaySettings
    policy: str
    endpoints: tuple[EndpointConfig, ...]
    simulated: SimulatedFleetConfig | None
    scheduler: SchedulerSettings = DEFAULTS.scheduler
    admission: AdmissionSettings = DEFAULTS.admission
    tenants: TenantDirectory | None = None  # None: open (every request is the default tenant)
    profiles: Any = MappingProxyType({})  # custom scheduling profiles by name (scheduler.profiles)
    reliability: ReliabilitySettings = DEFAULTS.reliability
    #: the file's ``tenants`` and ``api_keys`` as read (None: neither): a reload builds its tenants again from them
    #: with the admission settings the gateway runs with (steersman.api.reload)
    tenants_doc: TenantsDoc | None = None


def parse_fleet(data: Any, where: str = "fleet config") -> FleetConfig:
    try:
        raw = msgspec.convert(data if data is not None else {}, _FleetFile)
        load_plugins(raw.plugins)  # (the entry points' too): before any name below is looked up
        gateway = override(DEFAULTS.gateway, raw.gateway, f"{where}: gateway")
        sched_raw = dict(raw.scheduler)
        slo = sched_raw.pop("slo_classes", None)
        profiles = _profiles(sched_raw.pop("profiles", None), f"{where}: scheduler.profiles")
        scheduler = override(DEFAULTS.scheduler, sched_raw, f"{where}: scheduler")
        policy, policy_key = resolve_policy(raw.policy, scheduler.profile if "profile" in sched_raw else None, where)
        scheduler = replace(scheduler, profile=policy)
        if slo is not None:
            scheduler = replace(scheduler, slo_classes=_slo_classes(slo, f"{where}: scheduler.slo_classes"))
        if scheduler.default_slo not in scheduler.slo_classes:
            raise FleetConfigError(f"{where}: scheduler.default_slo {shown(scheduler.default_slo)} is not an SLO class")
        admission = override(DEFAULTS.admission, raw.admission, f"{where}: admission")
        rel_raw = dict(raw.reliability)
        brownout_models = rel_raw.pop("brownout_models", None)
        reliability = override(DEFAULTS.reliability, rel_raw, f"{where}: reliability")
        if brownout_models is not None:
            reliability = replace(reliability, brownout_models=_model_map(brownout_models,
                                                                          f"{where}: reliability.brownout_models"))
        tenants = tenants_doc = None
        if raw.tenants is not None or raw.api_keys is not None:
            doc = {k: v for k, v in (("tenants", raw.tenants), ("api_keys", raw.api_keys)) if v is not None}
            tenants, tenants_doc = TenantDirectory.from_data(doc, where, admission), TenantsDoc(doc)
    except msgspec.ValidationError as e:
        raise FleetConfigError(f"{where}: {e}") from None
    except (TenantConfigError, ValueError, PluginLoadError) as e:
        raise FleetConfigError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
    if not raw.endpoints and raw.simulated is None:
        raise FleetConfigError(f"{where}: no `endpoints` and no `simulated` fleet: nothing to route to")
    _check_replicas(raw, where)
    check_names(_replica_names(raw), where)
    check_queue_reaches_brownout(admission, reliability, "brownout_queue_depth" in rel_raw
                                 or bool(reliability.brownout_models), where)
    check_prefix_budget(scheduler, len(raw.endpoints) + sum(r.count for r in raw.simulated.replicas)
                        if raw.simulated else len(raw.endpoints), where)
    check_named_plugins(admission, gateway, where)
    from steersman.policy import POLICIES
    from steersman.policy.decode import DECODE_PICKERS

    if scheduler.decode_picker not in DECODE_PICKERS:
        raise FleetConfigError(f"{where}: unknown scheduler.decode_picker {shown(scheduler.decode_picker)}; "
                               f"known: {', '.join(DECODE_PICKERS.names())}")
    if policy not in POLICIES and policy not in profiles:
        known = ", ".join(sorted({*POLICIES.names(), *profiles}))
        raise FleetConfigError(f"{where}: {policy_key}: unknown policy {shown(policy)}; known: {known}")
    for name, spec in profiles.items():  # build each once now: a typo fails at startup, naming it
        _check_plugins(spec, f"{where}: scheduler.profiles.{name}", scheduler)
        try:
            make_profile(name, spec, scheduler)
        except Exception as e:  # noqa: BLE001 -- a plugin's own checks raise what they raise
            raise FleetConfigError(f"{where}: scheduler.profiles.{name}: {e}") from None
    return FleetConfig(gateway, policy, tuple(raw.endpoints), raw.simulated, scheduler, admission, tenants,
                       MappingProxyType(profiles), reliability, tenants_doc)


def _zmq_endpoint(value: str) -> bool:
    """``tcp://HOST:PORT`` (a port libzmq can connect to: 1-65535) or ``ipc://PATH``; libzmq refuses anything
    else only when the subscriber connects, after the gateway has started."""
    if value.startswith("ipc://"):
        return len(value) > len("ipc://")
    if not value.startswith("tcp://"):
        return False
    host, sep, port = value[len("tcp://"):].rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def sim_replica_names(cfg: SimulatedFleetConfig) -> list[tuple[str, SimReplicaConfig]]:
    """Each engine-sim replica's name, with its group: ``<pool>-<k>``, or ``<gpu>-<k>`` in the default pool
    (``h100-sxm-0``, ``h100-sxm-1``, ...); raises ``KeyError`` for an unknown GPU."""
    out = []
    seen: dict[str, int] = {}
    for spec in cfg.replicas:
        stem = spec.pool if spec.pool != "default" else gpu_profile(spec.gpu).name.lower()
        for _ in range(spec.count):
            k = seen[stem] = seen.get(stem, -1) + 1
            out.append((f"{stem}-{k}", spec))
    return out


def endpoint_name(i: int, ep: EndpointConfig) -> str:
    """The name the gateway gives endpoint ``i`` of its list (``Gateway._replica``): its own, else ``replica-<i>``."""
    return ep.name or f"replica-{i}"


def _replica_names(raw: _FleetFile) -> list[tuple[str, str, str, str]]:
    """Every replica's final name in the gateway's order (the endpoints, then the engine-sims it starts), with the
    key giving it, the replica and how the name is made (:func:`check_names`)."""
    out = [(endpoint_name(i, ep), f"endpoints[{i}].name", f"endpoints[{i}]",
            "its name" if ep.name else "an endpoint without a name is replica-<index>")
           for i, ep in enumerate(raw.endpoints)]
    groups = {id(r): g for g, r in enumerate(raw.simulated.replicas)} if raw.simulated else {}
    for name, spec in sim_replica_names(raw.simulated) if raw.simulated else ():
        g = groups[id(spec)]
        out.append((name, f"simulated.replicas[{g}]", f"a replica of simulated.replicas[{g}]",
                    "a simulated replica is <pool>-<k>" if spec.pool != "default" else "a simulated replica is <gpu>-<k>"))
    return out


def _check_replicas(raw: _FleetFile, where: str) -> None:
    """Every endpoint and simulated replica is one the gateway (and the twin) can run: checked before anything starts,
    so a typo is a FleetConfigError naming its field, not a traceback (or an engine-sim that exits) at startup."""
    from steersman.engines import ADAPTERS

    named: dict[str, int] = {}  # endpoint name -> its index: a replica's name is its identity (metrics, logs, guard)
    loras = {m: i for i, ep in enumerate(raw.endpoints) for m in ep.lora_modules}  # adapter -> an endpoint naming it
    for i, ep in enumerate(raw.endpoints):
        at = f"{where}: endpoints[{i}]"
        problem = endpoint_url_problem(ep.url)
        if problem is not None:
            raise FleetConfigError(f"{at}.url {problem}, got {shown(ep.url)}")
        if ep.engine not in ADAPTERS:
            raise FleetConfigError(f"{at}.engine: unknown engine {shown(ep.engine)}; known: {', '.join(ADAPTERS.names())}")
        if ep.name is not None:
            if ep.name in named:
                raise FleetConfigError(f"{at}.name {shown(ep.name)} is already the name of endpoints[{named[ep.name]}]")
            named[ep.name] = i
        for field in ("kv_events", "kv_events_replay"):
            value = getattr(ep, field)
            if value is not None and not _zmq_endpoint(value):
                raise FleetConfigError(f"{at}.{field} must be a ZMQ endpoint, tcp://HOST:PORT or ipc://PATH, "
                                       f"got {shown(value)}")
        if ep.kv_events_replay is not None and ep.kv_events is None:
            raise FleetConfigError(f"{at}.kv_events_replay needs endpoints[{i}].kv_events (the events it replays)")
        if ep.scheduling not in _SCHEDULING:
            raise FleetConfigError(f"{at}.scheduling must be fcfs or priority, got {shown(ep.scheduling)}")
        if ep.model_profile is not None:
            try:
                model_profile(ep.model_profile)
            except KeyError as e:
                raise FleetConfigError(f"{at}.model_profile: {e.args[0]}") from None
        if ep.kv_unified is not None and ep.engine != "llamacpp":
            raise FleetConfigError(f"{at}.kv_unified is for llama-server's slots (engine: llamacpp), not {ep.engine}")
        check_endpoint_tp(ep.tp, ep.gpu, ep.model_profile or (ep.models[0] if ep.models else None), at, ep.engine)
        if ep.lora_modules and not ep.models:
            raise FleetConfigError(f"{at}.lora_modules needs endpoints[{i}].models (the base model they adapt); "
                                   "without both, /v1/models is asked for them")
        clash = set(ep.lora_modules) & set(ep.models)
        if clash:
            raise FleetConfigError(f"{at}.lora_modules: {shown(sorted(clash)[0])} is in models too: a name is a base "
                                   "model or an adapter")
        base = next((m for m in ep.models if m in loras), None)
        if base is not None:  # its prompts are keyed fleet-wide (Fleet.lora_keys): its base model's would never match
            raise FleetConfigError(f"{at}.models: {shown(base)} is a LoRA adapter of endpoints[{loras[base]}] "
                                   "(lora_modules): a name is a base model or an adapter across the fleet")
        price = ep.price_per_hour
        if price is not None and not (math.isfinite(price) and price >= 0):
            raise FleetConfigError(f"{at}.price_per_hour must be a number >= 0, got {price!r}")
        if ep.gpu and price is None:
            try:
                gpu_profile(ep.gpu)
            except KeyError as e:  # its price comes from the GPU's profile
                raise FleetConfigError(f"{at}.gpu: {e.args[0]} (or give price_per_hour for a GPU without a profile)") from None
    check_same_engines([ep.url for ep in raw.endpoints], where)
    sim = raw.simulated
    if sim is None:
        return
    if not (math.isfinite(sim.speedup) and sim.speedup > 0):
        raise FleetConfigError(f"{where}: simulated.speedup must be > 0, got {sim.speedup!r}")
    for i, r in enumerate(sim.replicas):
        at = f"{where}: simulated.replicas[{i}]"
        if r.count < 1:
            raise FleetConfigError(f"{at}.count must be >= 1")
        if r.tp < 1:
            raise FleetConfigError(f"{at}.tp must be >= 1, got {r.tp}")
        if r.scheduling not in _SCHEDULING:
            raise FleetConfigError(f"{at}.scheduling must be fcfs or priority, got {shown(r.scheduling)}")
        if r.role not in ("both", "prefill", "decode"):
            raise FleetConfigError(f"{at}.role must be both, prefill or decode, got {shown(r.role)}")
        for key, profile in (("gpu", gpu_profile), ("model", model_profile)):
            try:
                profile(getattr(r, key))
            except KeyError as e:
                raise FleetConfigError(f"{at}.{key}: {e.args[0]}") from None
        try:  # what engine-sim (and the twin's replica) would refuse to start with
            check_tensor_parallel(model_profile(r.model), r.tp)
            engine = replace(DEFAULTS.engine, tensor_parallel=r.tp, scheduling_policy=r.scheduling)
            replica_capacity(gpu_profile(r.gpu), model_profile(r.model), engine)
        except ValueError as e:
            raise FleetConfigError(f"{at} ({r.model} on {r.tp} x {r.gpu}): {e}") from None
        if (r.served_model_name or r.model) in r.lora_modules:  # engine-sim refuses it at start (as the endpoints')
            raise FleetConfigError(f"{at}.lora_modules: {shown(r.served_model_name or r.model)} is the model's own name "
                                   "(served_model_name, else model): a name is a base model or an adapter")
    for name, spec in sim_replica_names(sim):
        if name in named:
            group = next(i for i, r in enumerate(sim.replicas) if r is spec)
            raise FleetConfigError(f"{where}: endpoints[{named[name]}].name {shown(name)} is the name of a simulated replica "
                                   f"(simulated.replicas[{group}]); name the endpoint otherwise")
    roles = {(r.model, r.role) for r in sim.replicas}
    for model, role in sorted(roles):
        other = "decode" if role == "prefill" else "prefill"
        if role != "both" and (model, other) not in roles:
            raise FleetConfigError(f"{where}: simulated.replicas: {model} has {role} replicas but no {other} ones")
    problem = None if sim.otlp_traces_endpoint is None else http_url_problem(sim.otlp_traces_endpoint)
    if problem is not None:
        raise FleetConfigError(f"{where}: simulated.otlp_traces_endpoint {problem}, got {shown(sim.otlp_traces_endpoint)}")
    link = sim.kv_link_gbit_s
    if link is not None and not link > 0:
        raise FleetConfigError(f"{where}: simulated.kv_link_gbit_s must be > 0, got {link}")


def check_spawnable(sim: SimulatedFleetConfig, where: str) -> None:
    """FleetConfigError unless the live gateway can start ``sim``'s engine-sim processes: at most
    ``sim_server.fleet_max_replicas`` in all (each is a Python process; the twin's in-process replicas are not
    bounded by this)."""
    total = sum(r.count for r in sim.replicas)
    cap = DEFAULTS.sim_server.fleet_max_replicas
    if total > cap:
        raise FleetConfigError(f"{where}: simulated.replicas ask for {total:,} engine-sim processes; the gateway starts "
                               f"at most {cap} (sim_server.fleet_max_replicas): run a larger fleet in "
                               f"`steersman simulate`, or start engines yourself and list them under endpoints")


def _model_map(data: Any, where: str) -> MappingProxyType:
    """``{model: model}`` (reliability.brownout_models), naming the key on a value that is not a model name."""
    if not isinstance(data, dict):
        raise FleetConfigError(f"{where} must map model names to cheaper model names, got {_kind(data)}")
    for k, v in data.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise FleetConfigError(f"{where}.{k}: model names are strings, got {_kind(k if not isinstance(k, str) else v)}")
        if k == v:  # (brown-out would shed what it was meant to move)
            raise FleetConfigError(f"{where}.{k}: a model browns out to another, cheaper model, not to itself")
    return MappingProxyType(dict(data))


def _slo_classes(data: Any, where: str) -> MappingProxyType:
    if not isinstance(data, dict) or not data:
        raise FleetConfigError(f"{where} must be a non-empty mapping of class name to {{ttft_s, tpot_s}}")
    out = {}
    for name, body in data.items():
        if body is None:
            body = {}  # `batch:` with no targets
        if not isinstance(body, dict):
            raise FleetConfigError(f"{where}.{name} must be a mapping {{ttft_s, tpot_s}} (or empty), got {_kind(body)}")
        unknown = set(body) - {"ttft_s", "tpot_s"}
        if unknown:
            raise FleetConfigError(f"{where}.{name}: unknown field(s) {sorted(map(str, unknown))} (ttft_s, tpot_s)")
        vals = []
        for f in ("ttft_s", "tpot_s"):
            v = body.get(f)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not (finite_number(v) and v > 0)):
                raise FleetConfigError(f"{where}.{name}.{f} must be a positive number of seconds or null, got {shown(v)}")
            vals.append(None if v is None else float(v))
        out[str(name)] = SloClass(*vals)
    return MappingProxyType(out)


def load_fleet(path: str | Path) -> FleetConfig:
    p = Path(path)
    try:
        data = load_yaml(p.read_bytes().decode("utf-8"))
    except OSError as e:
        raise FleetConfigError(f"cannot read {p}: {e}") from None
    except UnicodeDecodeError:
        raise FleetConfigError(f"cannot read {p}: not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise FleetConfigError(f"{p}: invalid YAML: {e}") from None
    except RecursionError:  # (thousands of nested brackets: the YAML reader recurses)
        raise FleetConfigError(f"{p}: invalid YAML: nested too deeply") from None
    try:
        cfg = parse_fleet(data, str(p))
    except RecursionError:
        raise FleetConfigError(f"{p}: nested too deeply") from None
    # here, not in parse_fleet: `steersman plan` checks a base fleet's settings with no replicas (twin/plan.py)
    if cfg.simulated is not None and not cfg.simulated.replicas:
        raise FleetConfigError(f"{p}: simulated.replicas must list at least one replica (or leave out `simulated`)")
    return cfg


def with_gateway(cfg: FleetConfig, **overrides: Any) -> FleetConfig:
    """The same fleet with some gateway settings changed (CLI flags: FleetConfigError naming the flag)."""
    changes = {k: v for k, v in overrides.items() if v is not None}
    try:
        gateway = replace(cfg.gateway, **changes)
    except ValueError as e:  # GatewaySettings checks its values (a port outside 0-65535, ...)
        raise FleetConfigError(f"--{e}") from None
    return msgspec.structs.replace(cfg, gateway=gateway)
