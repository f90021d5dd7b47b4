"""Failure drills: scenario steps that break replicas at given times, listed in the workload spec.

```yaml
drills:                                   # in the workload spec (top level), applied in every run
  - {at: 120s, kill: h100-h100-sxm-0}       # the process dies: its requests fail (502); the gateway stops
                                          #   routing there on the first failed dispatch or after the failed scrapes
  - {at: 300s, slow: {replica: 5, factor: 5}}          # a degraded GPU: every step takes 5x as long
  - {at: 400s, errors: {replica: a100-a100-6, rate: 0.3}}  # 30% of dispatches there answer 5xx (502 to the client)
  - {at: 500s, restore: h100-h100-sxm-0}  # back to normal: no slowdown, no errors; a killed replica restarts
                                          #   cold (weights load, empty KV cache) and takes traffic once warm
  - {at: 600s, drain: 3}                  # an operator takes it out of rotation (POST /admin/replicas/{name}/drain):
                                          #   its requests under way finish, no new one goes there
  - {at: 900s, resume: 3}                 # back in rotation (POST /admin/replicas/{name}/resume)
```

``at`` is simulated time since the run started: seconds as a number or a string
with a unit (``250ms``, ``120s``, ``2m``, ``1.5h``); it does not scale with the
load multiplier.  A replica is named as the twin names it (``steersman simulate``
lists them: ``{pool}-{gpu}-{index}`` for simulated replicas, e.g. ``h100-h100-sxm-0``, an endpoint's
``name``) or by its index in the fleet.  Errors are :class:`DrillError` naming the
field, e.g. ``drills[1].slow.factor must be a number >= 1, got 0.5``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DrillError", "DrillStep", "parse_drills", "schedule_drills", "ACTIONS"]

ACTIONS = ("kill", "slow", "errors", "restore", "drain", "resume")
_BARE = ("kill", "restore", "drain", "resume")  # the actions that name a replica alone
_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|m|h)?\s*$")


class DrillError(ValueError):
    """A drill step is invalid; the message names the field."""


@dataclass(frozen=True, slots=True)
class DrillStep:
    at: float  # simulated seconds since the start
    action: str  # kill | slow | errors | restore | drain | resume
    replica: str | int  # a replica name or index
    value: float | None = None  # slow: factor; errors: rate

    def as_json(self) -> dict:
        return {"at_s": self.at, "action": self.action, "replica": self.replica, "value": self.value}


def _seconds(v: Any, field: str) -> float:
    if isinstance(v, bool):
        raise DrillError(f"{field} must be a time (e.g. 120, '120s', '2m'), got {v!r}")
    if isinstance(v, (int, float)):
        x = float(v)
    elif isinstance(v, str) and (m := _DURATION.match(v)):
        x = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    else:
        raise DrillError(f"{field} must be a time (e.g. 120, '120s', '2m'), got {v!r}")
    if not math.isfinite(x) or x < 0:
        raise DrillError(f"{field} must be a time >= 0, got {v!r}")
    return x


def _replica(v: Any, field: str) -> str | int:
    if isinstance(v, bool) or not isinstance(v, (str, int)) or (isinstance(v, str) and not v) or (
            isinstance(v, int) and v < 0):
        raise DrillError(f"{field} must be a replica name or index >= 0, got {v!r}")
    return v


def _number(body: Mapping, key: str, field: str, lo: float, hi: float) -> float:
    v = body.get(key)
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and lo <= v <= hi
    if not ok:
        rng = f">= {lo:g}" if math.isinf(hi) else f"in [{lo:g}, {hi:g}]"
        raise DrillError(f"{field}.{key} must be a number {rng}, got {v!r}")
    return float(v)


def parse_drills(data: Any, where: str = "drills") -> tuple[DrillStep, ...]:
    """Validate the ``drills:`` list of a spec; steps come back in the listed order (steps at the same time
    happen in that order)."""
    if data is None:
        return ()
    if not isinstance(data, Sequence) or isinstance(data, (str, bytes)):
        raise DrillError(f"{where} must be a list of steps like {{at: 120s, kill: replica}}, got {type(data).__name__}")
    steps = []
    for i, body in enumerate(data):
        field = f"{where}[{i}]"
        if not isinstance(body, Mapping):
            raise DrillError(f"{field} must be a mapping like {{at: 120s, kill: replica}}, got {body!r}")
        acts = [a for a in ACTIONS if a in body]
        if unknown := sorted(map(str, set(body) - {"at", *ACTIONS})):
            raise DrillError(f"{field}: unknown field(s) {unknown}; a step has 'at' and one of {list(ACTIONS)}")
        if len(acts) != 1:
            raise DrillError(f"{field} needs exactly one action of {list(ACTIONS)}, got {acts or 'none'}")
        if "at" not in body:
            raise DrillError(f"{field}.at is required (when the step happens, e.g. 120s)")
        at = _seconds(body["at"], f"{field}.at")
        act = acts[0]
        v = body[act]
        if act in _BARE:
            steps.append(DrillStep(at, act, _replica(v, f"{field}.{act}")))
            continue
        key, lo, hi = ("factor", 1.0, math.inf) if act == "slow" else ("rate", 0.0, 1.0)
        if not isinstance(v, Mapping):
            raise DrillError(f"{field}.{act} must be a mapping {{replica: ..., {key}: ...}}, got {v!r}")
        if unknown := sorted(map(str, set(v) - {"replica", key})):
            raise DrillError(f"{field}.{act}: unknown field(s) {unknown}; known: ['replica', '{key}']")
        if "replica" not in v:
            raise DrillError(f"{field}.{act}.replica is required")
        steps.append(DrillStep(at, act, _replica(v["replica"], f"{field}.{act}.replica"),
                               _number(v, key, f"{field}.{act}", lo, hi)))
    return tuple(steps)


def resolve(step: DrillStep, names: Sequence[str], field: str = "drills") -> int:
    """The fleet index a step's replica names."""
    r = step.replica
    if isinstance(r, int):
        if r >= len(names):
            raise DrillError(f"{field}: replica index {r} is out of range (the fleet has {len(names)} replicas)")
        return r
    if r not in names:
        raise DrillError(f"{field}: unknown replica {r!r}; the fleet's replicas: {list(names)}")
    return names.index(r)


def schedule_drills(twin, steps: Sequence[DrillStep]) -> None:
    """Put every step on the twin's timeline (all replicas are resolved first: a bad name fails before the run)."""
    names = [p.name for p in twin.tf.plans]
    resolved = [(s, resolve(s, names, f"drills[{k}].{s.action}")) for k, s in enumerate(steps)]
    for s, i in resolved:
        if s.action == "kill":
            twin.schedule_drill(s.at, lambda tw, i=i: tw.kill(i))
        elif s.action == "slow":
            twin.schedule_drill(s.at, lambda tw, i=i, f=s.value: tw.slow(i, f))
        elif s.action == "errors":
            twin.schedule_drill(s.at, lambda tw, i=i, r=s.value: tw.errors(i, r))
        elif s.action in ("drain", "resume"):
            twin.schedule_drill(s.at, lambda tw, i=i, d=s.action == "drain": tw.drain(i, d))
        else:
            twin.schedule_drill(s.at, lambda tw, i=i: tw.restore(i))
