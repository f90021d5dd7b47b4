"""Capacity planning by simulation: the cheapest fleet that meets the SLO, and replicas per hour.

For every candidate GPU type the planner searches (exponentially, then by
bisection) the smallest replica count whose twin run, at the workload's load
times ``1 + headroom``, keeps SLO attainment at or above the target with no
request refused or failed beyond it.  It then prices each option ($/h, $ per
successful task) and picks the cheapest.

Elasticity: the workload's load is taken as the peak hour's.  A planned fleet
serves ``offered × (1 + headroom) / replicas`` requests per second per replica at
its target; over a daily curve (default: a sinusoid from 25% at 02:00 to 100% at
14:00) hour h needs ``ceil(offered × m_h / max(m) × (1 + headroom) / per_replica)``.
That assumes capacity scales linearly with replicas (true for independent
replicas behind the scheduler; prefix locality makes it slightly conservative).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steersman.config import DEFAULTS
from steersman.fleet.config import parse_fleet
from steersman.sim import gpu_profile, model_profile
from steersman.twin.run import Experiment, scale_spec
from steersman.twin.workload import DailyCurve, load_workload

__all__ = ["Option", "Plan", "plan_capacity"]

#: Doubling the fleet must raise SLO attainment by more than this, or the GPU type cannot meet the target.
_PLATEAU = 0.002


@dataclass(frozen=True, slots=True)
class Option:
    gpu: str
    replicas: int
    cost_per_hour: float
    slo_attainment: float
    cost_per_successful_task: float | None
    per_replica_rps: float  # offered requests/s one replica absorbs at the target


@dataclass
class Plan:
    model: str
    target: float
    headroom: float
    offered_rps: float
    options: list[Option] = field(default_factory=list)
    infeasible: dict[str, str] = field(default_factory=dict)  # gpu -> why
    hourly: list[tuple[int, float, int]] = field(default_factory=list)  # (hour, offered rps, replicas)

    @property
    def best(self) -> Option | None:
        return min(self.options, key=lambda o: o.cost_per_hour) if self.options else None


def _fleet_doc(gpu: str, model: str, n: int, tp: int, base: Mapping[str, Any]) -> dict:
    doc = {k: v for k, v in base.items() if k in ("scheduler", "admission", "tenants", "api_keys", "policy")}
    doc["simulated"] = {"replicas": [{"gpu": gpu, "model": model, "count": n, "tp": tp}]}
    return doc


def plan_capacity(spec: Mapping[str, Any], gpus: Sequence[str], *, target: float = 0.99, headroom: float = 0.2,
                  policy: str = DEFAULTS.scheduler.profile, tp: int = 1, seed: int = 0, base_dir: Path | None = None,
                  duration_s: float | None = None, max_replicas: int = 512, base_fleet: Mapping[str, Any] | None = None,
                  curve: DailyCurve | None = None, progress: Callable[[str], None] | None = None) -> Plan:
    model = spec.get("model") or DEFAULTS.sim_server.model
    model_profile(model)
    probe = load_workload(spec, seed, base_dir=base_dir)
    offered = probe.offered_load().requests_per_s
    plan = Plan(model, target, headroom, offered)
    stressed = scale_spec(spec, 1.0 + headroom)

    def meets(gpu: str, n: int) -> tuple[bool, dict]:
        cfg = parse_fleet(_fleet_doc(gpu, model, n, tp, base_fleet or {}), f"plan {n} x {gpu}")
        exp = Experiment(cfg, stressed, base_dir, seed, duration_s)
        s = exp.run(policy)
        ok = (s["slo_attainment"] or 0.0) >= target and (s["refused"] + s["failed"]) <= (1 - target) * s["requests"]
        if progress is not None:
            progress(f"{n:4d} x {gpu}: SLO {100 * (s['slo_attainment'] or 0):.1f}% -> {'ok' if ok else 'short'}")
        return ok, s

    for gpu in gpus:
        name = gpu_profile(gpu).name
        lo, hi, best, last = 0, 1, None, -1.0
        while True:  # exponential search for a count that meets the target
            try:
                ok, s = meets(gpu, hi)
            except ValueError as e:  # the model does not fit this GPU at this tp
                plan.infeasible[name] = str(e)
                break
            if ok:
                best = (hi, s)
                break
            got = s["slo_attainment"] or 0.0
            if hi >= 4 and got <= last + _PLATEAU:
                plan.infeasible[name] = (f"the SLO is out of reach on {name}: attainment plateaus at {100 * got:.1f}% "
                                         f"with {hi} replicas (requests too long for its targets)")
                break
            last = got
            lo = hi
            hi *= 2
            if hi > max_replicas:
                plan.infeasible[name] = f"not enough with {max_replicas} replicas"
                break
        if best is None:
            continue
        while hi - lo > 1:  # bisection between the last short count and the first enough
            mid = (lo + hi) // 2
            ok, s = meets(gpu, mid)
            if ok:
                hi, best = mid, (mid, s)
            else:
                lo = mid
        n, s = best
        price = gpu_profile(gpu).price_per_hour * tp * n
        plan.options.append(Option(name, n, price, s["slo_attainment"], s["cost_per_successful_task_usd"],
                                   offered * (1 + headroom) / n))
    best_opt = plan.best
    if best_opt is not None:
        means = (curve or DailyCurve.sinusoid(0.25, 1.0, 14.0)).hour_means()
        top = max(means)
        for h, m in enumerate(means):
            rps = offered * m / top
            plan.hourly.append((h, rps, max(1, math.ceil(rps * (1 + headroom) / best_opt.per_replica_rps))))
    return plan
