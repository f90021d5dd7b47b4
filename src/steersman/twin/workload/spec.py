"""The YAML workload spec: ``load_workload(path_or_dict, seed) -> Mix``.

```yaml
model: llama-3.1-8b            # default model of every source (required unless each source names one)
duration_s: 600                # default end_s of every source: no task starts / replayed arrival at or after it
                               # (--duration replaces it); without it, every source needs end_s or a cap
block_size: 16                 # tokens per hashed block; the twin (simulate, plan) refuses any but its engines' (the default)
seed: 1                        # used when load_workload gets no seed (steersman simulate / plan without --seed)
tenants:                       # optional; same fields as the gateway's tenants (priority, requests_per_minute, ...)
  acme: {priority: critical}
  free: {priority: sheddable}
curves:                        # optional named daily curves (see twin.workload.curve)
  office: {trough: 0.2, peak: 1.0, peak_hour: 14}
sources:
  # agent applications: chatbot | copilot | research | autonomous (presets), or agent (give every shape field)
  - kind: copilot
    name: acme-copilot         # unique; prefixes workflow ids (default: the kind, numbered if repeated)
    tenant: acme               # must be listed under tenants when tenants is given (default: default)
    model: llama-3.1-8b        # default: the top-level model
    slo: interactive           # interactive | standard | batch (or the classes passed to load_workload), or null
    deadline_s: 30             # relative deadline of each call, or null
    tasks_per_s: 2             # Poisson task arrivals ... (shaped by curve:) ...
    # users: 50                #   ... or a closed population of users running tasks back to back
    # think_s: {dist: exponential, mean: 60}   # user mode: pause between a user's tasks
    # ramp_s: 60                               # user mode: first tasks spread uniformly over [start_s, start_s + ramp_s)
    # tasks_per_user: 10                       # user mode: tasks per user (default unbounded)
    max_tasks: 1000            # optional cap on tasks started (open loop)
    start_s: 0
    end_s: 600                 # overrides duration_s
    curve: office              # a name from curves, or an inline curve
    system_prompt_tokens: 1500
    system_prompt_id: acme-v1  # sources with the same id share the system prompt's blocks
    task_tokens: {dist: lognormal, mean: 1500, cv: 0.8}   # distributions: see twin.workload.dists
    calls: [10, 20]
    output_tokens: {dist: lognormal, mean: 200, cv: 1}
    max_tokens: 2048           # null: requests give no limit
    tool_tokens: {dist: lognormal, mean: 400, cv: 1}
    gap_s: {dist: lognormal, mean: 1.5, cv: 1}
    max_context_tokens: 32768  # null: never compact
    compact_to_tokens: 8000
    retries: 2
    retry_backoff_s: 1.0
    announce_steps: true
  # trace replay (open loop)
  - kind: trace
    path: ../shared/traces/mooncake-synthetic.jsonl   # relative to the spec file's directory, else the cwd
    format: auto               # azure | mooncake | auto (by extension)
    tenant: free               # or {free: 0.7, acme: 0.3}, drawn per request
    slo: batch                 # or {batch: 0.5, standard: 0.5}
    speed: 2.0                 # 2x faster
    limit: 1000
    offset_s: 0
    repeat: 1
    max_tokens: null           # null | an integer | exact
    deadline_s: null
    curve: office
drills:                        # optional failure drills (see steersman.twin.drills), at simulated times
  - {at: 120s, kill: h100-h100-sxm-0}
  - {at: 300s, restore: h100-h100-sxm-0}
```

Errors are :class:`WorkloadSpecError` naming the field, e.g.
``workload spec: sources[0].calls: range [min, max] needs min <= max, got [20, 10]``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from steersman.config import DEFAULTS
from steersman.config._yaml import load_yaml
from steersman.config.admission import AdmissionSettings
from steersman.config.scheduler import SchedulerSettings
from steersman.control.tenants import TenantConfigError, TenantDirectory
from steersman.twin.drills import DrillError, parse_drills
from steersman.twin.workload.agents import PRESETS, AgentApp, AgentSource
from steersman.twin.workload.curve import CurveError, DailyCurve, parse_curve
from steersman.twin.workload.dists import DistError, parse_dist
from steersman.twin.workload.mix import Mix
from steersman.twin.workload.traces import TraceError, TraceSource, load_trace

__all__ = ["load_workload", "parse_workload", "WorkloadSpecError"]


class WorkloadSpecError(ValueError):
    """The workload spec is invalid; the message names the field."""


_TOP = {"model", "duration_s", "block_size", "seed", "tenants", "curves", "sources", "drills"}
_COMMON = {"kind", "name", "tenant", "model", "slo", "deadline_s", "end_s", "curve"}
_AGENT_LOAD = {"tasks_per_s", "users", "think_s", "ramp_s", "tasks_per_user", "max_tasks", "start_s"}
_APP_DISTS = ("task_tokens", "calls", "output_tokens", "tool_tokens", "gap_s")
_APP_OTHER = ("system_prompt_tokens", "system_prompt_id", "max_tokens", "max_context_tokens", "compact_to_tokens",
              "retries", "retry_backoff_s", "announce_steps")
_AGENT_KEYS = _COMMON | _AGENT_LOAD | set(_APP_DISTS) | set(_APP_OTHER)
_TRACE_KEYS = _COMMON | {"path", "format", "speed", "limit", "offset_s", "repeat", "max_tokens"}
_KINDS = sorted([*PRESETS, "agent", "trace"])


def load_workload(spec: str | os.PathLike | Mapping[str, Any], seed: int | None = None, *,
                  slo_classes: Iterable[str] | None = None, base_dir: str | os.PathLike | None = None,
                  admission: AdmissionSettings | None = None) -> Mix:
    """Build the workload a spec describes: a YAML file path, or its parsed mapping.

    ``seed`` (default: the spec's ``seed``, else 0) fixes every random draw; each
    source gets its own stream (by its position in ``sources``).  ``slo_classes``
    are the class names a source may use (default: the scheduler's interactive,
    standard, batch).  Relative trace paths are looked up in ``base_dir`` (default:
    the spec file's directory) and then the working directory.  ``admission``: the fleet's admission settings
    (a tenant that names no priority class, listed or only named by a source, gets its ``default_priority``, as
    the gateway gives it); default: the defaults.
    """
    where = "workload spec"
    if isinstance(spec, Mapping):
        data: Any = spec
    else:
        p = Path(spec)
        where = str(p)
        try:
            data = load_yaml(p.read_bytes().decode("utf-8"))  # as the fleet file: no key twice, YAML 1.2 numbers
        except OSError as e:
            raise WorkloadSpecError(f"cannot read {p}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise WorkloadSpecError(f"cannot read {p}: not UTF-8 text") from None
        except yaml.YAMLError as e:
            raise WorkloadSpecError(f"{p}: invalid YAML: {e}") from None
        if base_dir is None:
            base_dir = p.parent
    return parse_workload(data, seed, slo_classes=slo_classes, base_dir=base_dir, where=where, admission=admission)


def parse_workload(data: Any, seed: int | None = None, *, slo_classes: Iterable[str] | None = None,
                   base_dir: str | os.PathLike | None = None, where: str = "workload spec",
                   admission: AdmissionSettings | None = None) -> Mix:
    admission = admission or AdmissionSettings()

    def err(msg: str) -> WorkloadSpecError:
        return WorkloadSpecError(f"{where}: {msg}")

    if not isinstance(data, Mapping):
        raise err(f"expected a mapping with 'sources', got {type(data).__name__}")
    if unknown := sorted(map(str, set(data) - _TOP)):
        raise err(f"unknown key(s) {unknown}; known: {sorted(_TOP)}")
    f = _Fields(data, "", err)
    model = f.string("model", optional=True)
    duration = f.number("duration_s", positive=True, optional=True)
    block_size = f.integer("block_size", minimum=1, default=DEFAULTS.engine.block_size)
    if seed is None:
        seed = f.integer("seed", minimum=0, default=0)
    elif not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise err(f"seed must be an integer >= 0, got {seed!r}")
    slos = set(SchedulerSettings().slo_classes) if slo_classes is None else set(slo_classes)

    try:
        parse_drills(data.get("drills"))  # applied by the twin (steersman.twin.run); validated with the spec
    except DrillError as e:
        raise err(str(e)) from None

    tenants_raw = data.get("tenants")
    tenants = None
    if tenants_raw is not None:
        try:
            tenants = TenantDirectory.from_data({"tenants": tenants_raw}, where, admission).tenants
        except TenantConfigError as e:
            raise WorkloadSpecError(str(e)) from None

    curves: dict[str, DailyCurve] = {}
    raw_curves = data.get("curves")
    if raw_curves is not None:
        if not isinstance(raw_curves, Mapping):
            raise err(f"curves must be a mapping name -> curve, got {type(raw_curves).__name__}")
        for name, c in raw_curves.items():
            try:
                curves[str(name)] = parse_curve(c)
            except CurveError as e:
                raise err(f"curves.{name}: {e}") from None

    raw_sources = data.get("sources")
    if not isinstance(raw_sources, list) or not raw_sources:
        raise err("sources must be a non-empty list")
    root = np.random.SeedSequence(seed)
    sources = []
    used_names: set[str] = set()
    kinds_seen: dict[str, int] = {}
    for i, body in enumerate(raw_sources):
        field = f"sources[{i}]"
        if not isinstance(body, Mapping):
            raise err(f"{field} must be a mapping, got {type(body).__name__}")
        kind = body.get("kind")
        if kind not in _KINDS:
            raise err(f"{field}.kind must be one of {_KINDS}, got {kind!r}")
        known = _TRACE_KEYS if kind == "trace" else _AGENT_KEYS
        if unknown := sorted(map(str, set(body) - known)):
            raise err(f"{field}: unknown field(s) {unknown} for kind {kind}; known: {sorted(known)}")
        sf = _Fields(body, field + ".", err)
        src_model = sf.string("model", optional=True) or model
        if src_model is None:
            raise err(f"{field}.model: no model (set it here or at the top level)")
        name = sf.string("name", optional=True)
        if name is None:
            base = kind if kind != "trace" else Path(str(body.get("path", "trace"))).stem
            kinds_seen[base] = kinds_seen.get(base, 0) + 1
            name = base if kinds_seen[base] == 1 else f"{base}{kinds_seen[base]}"
            while name in used_names:
                name += "_"
        if name in used_names:
            raise err(f"{field}.name {name!r} is already used by another source")
        used_names.add(name)
        slo = _label(body, "slo", field, err, slos, allow_mix=kind == "trace", allow_none=True)
        tenant = _label(body, "tenant", field, err, None, allow_mix=kind == "trace", allow_none=False) or "default"
        for t in ([tenant] if isinstance(tenant, str) else list(tenant)):
            if tenants is not None and t not in tenants:
                raise err(f"{field}.tenant {t!r} is not listed in tenants (known: {sorted(tenants)})")
        deadline = sf.number("deadline_s", positive=True, optional=True)
        end_s = sf.number("end_s", positive=False, optional=True)
        if end_s is None:
            end_s = duration
        curve = None
        if body.get("curve") is not None:
            c = body["curve"]
            if isinstance(c, str):
                if c not in curves:
                    raise err(f"{field}.curve {c!r} is not defined under curves (known: {sorted(curves)})")
                curve = curves[c]
            else:
                try:
                    curve = parse_curve(c)
                except CurveError as e:
                    raise err(f"{field}.curve: {e}") from None
        sseed = np.random.SeedSequence(root.entropy, spawn_key=(i,))
        common = dict(tenant=tenant, model=src_model, seed=sseed, slo=slo, deadline_s=deadline, end_s=end_s,
                      curve=curve, name=name, block_size=block_size)
        try:
            if kind == "trace":
                sources.append(_trace(sf, body, field, base_dir, common, err))
            else:
                sources.append(_agent(sf, body, field, kind, common, err))
        except (TraceError, DistError, CurveError) as e:
            raise err(f"{field}: {e}") from None
        except ValueError as e:
            if isinstance(e, WorkloadSpecError):
                raise
            raise err(f"{field}: {e}") from None
    try:
        return Mix(sources, tenants, default_priority=admission.default_priority)
    except ValueError as e:
        raise err(str(e)) from None


def _label(body, key, field, err, allowed, *, allow_mix, allow_none):
    v = body.get(key)
    if v is None:
        if key in body and not allow_none:
            raise err(f"{field}.{key} must be a name")
        return None
    names = [v] if isinstance(v, str) else (list(v) if isinstance(v, Mapping) and allow_mix else None)
    if names is None:
        raise err(f"{field}.{key} must be a name{' or a mapping name -> weight' if allow_mix else ''}, got {v!r}"
                  f"{_quote_it(v)}")
    for n in names:
        if not isinstance(n, str):
            raise err(f"{field}.{key}: names must be strings, got {n!r}{_quote_it(n)}")
        if allowed is not None and n not in allowed:
            raise err(f"{field}.{key} {n!r} is not a known class; known: {sorted(allowed)}")
    if isinstance(v, Mapping):
        for n, w in v.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise err(f"{field}.{key}.{n}: weight must be a number >= 0, got {w!r}")
        if not sum(v.values()) > 0:
            raise err(f"{field}.{key}: weights must not all be 0")
        return dict(v)
    return v


def _quote_it(v: Any) -> str:
    """The hint for a name YAML read as something else: a spec is read as the fleet file (``on``, ``yes`` are
    booleans; ``1e3``, ``0x1F`` numbers), and quoting keeps it a string."""
    if isinstance(v, (bool, int, float)):
        return " (quote it: YAML reads on/off/yes/no/true/false as booleans and 1e3, 0x1F, 012 as numbers)"
    return ""


def _agent(sf: _Fields, body, field, kind, common, err) -> AgentSource:
    changes: dict[str, Any] = {}
    for k in _APP_DISTS:
        if k in body:
            try:
                changes[k] = parse_dist(body[k])
            except DistError as e:
                raise err(f"{field}.{k}: {e}") from None
        elif kind == "agent":
            raise err(f"{field}.{k} is required for kind agent (or use a preset kind: {sorted(PRESETS)})")
    if "system_prompt_tokens" in body or kind == "agent":
        changes["system_prompt_tokens"] = sf.integer("system_prompt_tokens", minimum=0)
    if "system_prompt_id" in body:
        changes["system_prompt_id"] = sf.string("system_prompt_id", optional=True)
    if "max_tokens" in body:
        changes["max_tokens"] = sf.integer("max_tokens", minimum=1, optional=True)
    if "max_context_tokens" in body:
        changes["max_context_tokens"] = sf.integer("max_context_tokens", minimum=1, optional=True)
    if "compact_to_tokens" in body:
        changes["compact_to_tokens"] = sf.integer("compact_to_tokens", minimum=1)
    if "retries" in body:
        changes["retries"] = sf.integer("retries", minimum=0)
    if "retry_backoff_s" in body:
        changes["retry_backoff_s"] = sf.number("retry_backoff_s", positive=False)
    if "announce_steps" in body:
        changes["announce_steps"] = sf.boolean("announce_steps")
    if kind == "agent":
        app = AgentApp(kind="agent", **changes)
    else:
        app = PRESETS[kind].replace(**changes)
    tasks_per_s = sf.number("tasks_per_s", positive=True, optional=True)
    users = sf.integer("users", minimum=1, optional=True)
    if (tasks_per_s is None) == (users is None):
        raise err(f"{field}: give exactly one of tasks_per_s (open loop) and users (a closed population)")
    if users is None:
        for k in ("think_s", "ramp_s", "tasks_per_user"):
            if k in body:
                raise err(f"{field}.{k} applies to a user population (users:), not to tasks_per_s")
    elif common["curve"] is not None:
        raise err(f"{field}.curve shapes tasks_per_s; it does not apply to a user population")
    elif "max_tasks" in body:
        raise err(f"{field}.max_tasks caps open-loop tasks; a user population has tasks_per_user")
    think = 0.0
    if "think_s" in body:
        try:
            think = parse_dist(body["think_s"])
        except DistError as e:
            raise err(f"{field}.think_s: {e}") from None
    start_s = sf.number("start_s", positive=False, optional=True) or 0.0
    if common["end_s"] is not None and common["end_s"] < start_s:
        raise err(f"{field}.end_s ({common['end_s']}) is before start_s ({start_s})")
    return AgentSource(
        app, tasks_per_s=tasks_per_s, users=users, think_s=think,
        ramp_s=sf.number("ramp_s", positive=False, optional=True) or 0.0,
        tasks_per_user=sf.integer("tasks_per_user", minimum=0, optional=True),
        max_tasks=sf.integer("max_tasks", minimum=0, optional=True), start_s=start_s, **common,
    )


def _trace(sf: _Fields, body, field, base_dir, common, err) -> TraceSource:
    path = sf.string("path")
    fmt = sf.string("format", optional=True) or "auto"
    p = Path(path)
    if not p.is_absolute():
        tried = []
        for base in ([Path(base_dir)] if base_dir is not None else []) + [Path.cwd()]:
            tried.append(str(base / p))
            if (base / p).exists():
                p = base / p
                break
        else:
            raise err(f"{field}.path: trace {path!r} not found (tried {tried})")
    try:
        data = load_trace(p, fmt)
    except TraceError as e:
        raise err(f"{field}.path: {e}") from None
    mx = body.get("max_tokens")
    if mx is not None and mx != "exact":
        mx = sf.integer("max_tokens", minimum=1)
    return TraceSource(
        data, speed=sf.number("speed", positive=True, optional=True) or 1.0,
        limit=sf.integer("limit", minimum=1, optional=True),
        offset_s=sf.number("offset_s", positive=False, optional=True) or 0.0,
        repeat=sf.integer("repeat", minimum=1, default=1), max_tokens=mx, **common,
    )


class _Fields:
    """Typed reads of one mapping with errors that name the field."""

    def __init__(self, body: Mapping, prefix: str, err) -> None:
        self.body = body
        self.prefix = prefix
        self.err = err

    def _get(self, key: str, optional: bool, default=None):
        v = self.body.get(key)
        if v is None:
            if not optional and default is None:
                raise self.err(f"{self.prefix}{key} is required")
            return default
        return v

    def number(self, key: str, *, positive: bool, optional: bool = False) -> float | None:
        v = self._get(key, optional)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.err(f"{self.prefix}{key} must be a finite number, got {v!r}")
        if v < 0 or (positive and v == 0):
            raise self.err(f"{self.prefix}{key} must be {'> 0' if positive else '>= 0'}, got {v!r}")
        return float(v)

    def integer(self, key: str, *, minimum: int, optional: bool = False, default: int | None = None) -> int | None:
        v = self._get(key, optional, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.err(f"{self.prefix}{key} must be an integer, got {v!r}")
        if v < minimum:
            raise self.err(f"{self.prefix}{key} must be >= {minimum}, got {v!r}")
        return v

    def string(self, key: str, *, optional: bool = False) -> str | None:
        v = self._get(key, optional)
        if v is None:
            return None
        if not isinstance(v, str) or not v:
            raise self.err(f"{self.prefix}{key} must be a non-empty string, got {v!r}{_quote_it(v)}")
        return v

    def boolean(self, key: str) -> bool:
        v = self.body.get(key)
        if not isinstance(v, bool):
            raise self.err(f"{self.prefix}{key} must be true or false, got {v!r}")
        return v
