"""Capacity planning by simulation: the cheapest fleet that meets the SLO, and replicas per hour.

For every candidate GPU type the planner searches (exponentially, then by
bisection) the smallest replica count whose twin run, at the workload's load
times ``1 + headroom``, keeps SLO attainment at or above the target with no
request refused or failed beyond it.  Then it tries fleets of two types that
cost less than the cheapest of those (:mod:`steersman.twin.plan_mix`: seven
A100s and an L40S where eight A100s were needed), cheapest first, each by
simulation, up to ``max_mixed_trials`` runs.  It prices each fleet that met the
SLO ($/h, $ per successful task) and picks the cheapest.

Elasticity: the workload's load is taken as the peak hour's.  Over a daily
curve (default: a sinusoid from 25% at 02:00 to 100% at 14:00) hour h needs its
share of the peak load; assuming capacity scales linearly with replicas (true
for independent replicas behind the scheduler; prefix locality makes it
slightly conservative), a type that met the peak with ``n`` replicas covers
share ``s`` with ``ceil(s x n)`` of them, or with a cheaper mix of two types
(:func:`~steersman.twin.plan_mix.cover`); no hour costs more than the peak plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from steersman.config import DEFAULTS
from steersman.fleet.config import parse_fleet
from steersman.sim import gpu_profile, model_profile, replica_capacity
from steersman.sim.memory import check_tensor_parallel
from steersman.twin.plan_mix import Fleet, TypeFit, candidates, cover, fleet_cost, label
from steersman.twin.run import Experiment, policy_for, scale_spec
from steersman.twin.workload import DailyCurve, load_workload

__all__ = ["Option", "Plan", "plan_capacity", "DAY_CURVE", "day_curve_text"]

#: Doubling the fleet must raise SLO attainment by more than this, or the GPU type cannot meet the target.
_PLATEAU = 0.002


@dataclass(frozen=True, slots=True)
class Option:
    """A fleet that met the SLO in its twin run."""

    fleet: Fleet  # (GPU name, replicas) per type, most replicas first
    cost_per_hour: float
    slo_attainment: float
    cost_per_successful_task: float | None
    per_replica_rps: float  # offered requests/s (at the stressed load) per replica of the fleet

    @property
    def gpu(self) -> str:
        """The GPU type, or the mix (``7 x A100-80GB + 1 x L40S``)."""
        return self.fleet[0][0] if len(self.fleet) == 1 else label(self.fleet)

    @property
    def replicas(self) -> int:
        return sum(k for _, k in self.fleet)

    @property
    def mixed(self) -> bool:
        return len(self.fleet) > 1


@dataclass
class Plan:
    model: str
    target: float
    headroom: float
    offered_rps: float
    options: list[Option] = field(default_factory=list)  # every type that met, then the mix that did (if any)
    infeasible: dict[str, str] = field(default_factory=dict)  # gpu -> why
    hourly: list[tuple[int, float, Fleet, float]] = field(default_factory=list)  # (hour, offered rps, fleet, $/h)
    trials: int = 0  # twin runs the search made
    mixed_tried: list[tuple[Fleet, float]] = field(default_factory=list)  # mixes simulated: (fleet, SLO attainment)

    @property
    def best(self) -> Option | None:
        return min(self.options, key=lambda o: (o.cost_per_hour, o.mixed)) if self.options else None


def _fleet_doc(fleet: Fleet, model: str, tp: int, base: Mapping[str, Any]) -> dict:
    doc = {k: v for k, v in base.items() if k in ("scheduler", "admission", "tenants", "api_keys", "policy",
                                                          "plugins")}
    doc["simulated"] = {"replicas": [{"gpu": gpu, "model": model, "count": n, "tp": tp} for gpu, n in fleet]}
    return doc


_T = DEFAULTS.twin
#: the day's load for the elasticity table: a sinusoid (low share of the peak, high share, the peak's hour)
DAY_CURVE = (0.25, 1.0, 14.0)


def day_curve_text(curve: tuple[float, float, float] = DAY_CURVE) -> str:
    """:data:`DAY_CURVE` in words (the plan's elasticity table names the day it assumed)."""
    low, high, peak = curve
    return (f"a sinusoid from {low:.0%} of the peak at {(peak + 12) % 24:02.0f}:00 to {high:.0%} at "
            f"{peak:02.0f}:00")


def plan_capacity(spec: Mapping[str, Any], gpus: Sequence[str], *, target: float = _T.plan_slo,
                  headroom: float = _T.plan_headroom, policy: str | None = None, tp: int = 1,
                  seed: int = 0, base_dir: Path | None = None, duration_s: float | None = None,
                  max_replicas: int = _T.plan_max_replicas, base_fleet: Mapping[str, Any] | None = None,
                  curve: DailyCurve | None = None, max_mixed_trials: int = _T.plan_mixed_trials,
                  progress: Callable[[str], None] | None = None, trial: Callable[[Fleet], dict] | None = None,
                  workers: int = _T.plan_workers) -> Plan:
    """``trial``: runs one fleet and returns its summary (``slo_attainment``, ``requests``, ``refused``,
    ``failed``, ``cost_per_successful_task_usd``); default: the twin at the stressed load.  ``workers`` > 1:
    the GPU types are searched in that many processes at once (twin-backed trials only; the same plan).
    ``policy``: the routing profile of every trial; None: ``base_fleet``'s ``policy`` (its default, steersman)."""
    model = spec.get("model") or DEFAULTS.sim_server.model
    check_tensor_parallel(model_profile(model), tp)
    # the base fleet's settings and the policy, checked once: a typo there is an error, not an infeasible GPU type
    base_cfg = parse_fleet(_fleet_doc((), model, tp, base_fleet or {}), "--fleet")
    policy = policy or base_cfg.policy
    policy_for(policy, base_cfg)
    probe = load_workload(spec, seed, base_dir=base_dir)
    offered = probe.offered_load().requests_per_s
    plan = Plan(model, target, headroom, offered)
    stressed = scale_spec(spec, 1.0 + headroom)

    twin = _Twin(model, tp, dict(base_fleet or {}), stressed, base_dir, seed, duration_s, policy)
    meets = _metered(trial or twin, target, plan, progress)

    def option(fleet: Fleet, s: dict, price: float) -> Option:
        n = sum(k for _, k in fleet)
        return Option(fleet, price, s["slo_attainment"], s["cost_per_successful_task_usd"], offered * (1 + headroom) / n)

    names = list(dict.fromkeys(gpu_profile(g).name for g in gpus))  # "A100,a100-80gb" is one type
    if not names:
        raise ValueError("no GPU type to plan with")
    for name in list(names):  # a type the model does not fit at this tp is out before any run
        try:
            replica_capacity(gpu_profile(name), model_profile(model), replace(DEFAULTS.engine, tensor_parallel=tp))
        except ValueError as e:
            plan.infeasible[name] = str(e)
            names.remove(name)
    fits: list[TypeFit] = []
    if workers > 1 and trial is None and len(names) > 1:
        found_by = _search_in_parallel(names, twin, target, max_replicas, workers, plan, progress)
    else:
        found_by = {name: _smallest(name, meets, plan, max_replicas) for name in names}
    for name in names:
        found = found_by[name]
        if found is not None:
            n, s = found
            price = gpu_profile(name).price_per_hour * tp
            fits.append(TypeFit(name, n, price))
            plan.options.append(option(((name, n),), s, price * n))
    if len(fits) > 1:
        cheapest = plan.best.cost_per_hour  # type: ignore[union-attr]
        for fleet in candidates(fits, cheapest)[:max_mixed_trials]:
            ok, s = meets(fleet)
            plan.mixed_tried.append((fleet, s["slo_attainment"] or 0.0))
            if ok:  # candidates come cheapest first: the first that meets is the mix to keep
                plan.options.append(option(fleet, s, fleet_cost(fleet, fits)))
                break
    best = plan.best
    if best is not None:
        means = (curve or DailyCurve.sinusoid(*DAY_CURVE)).hour_means()
        top = max(means)
        for h, m in enumerate(means):
            fleet, cost = cover(fits, m / top)
            if cost > best.cost_per_hour:  # the peak plan covers every hour
                fleet, cost = best.fleet, best.cost_per_hour
            plan.hourly.append((h, offered * m / top, fleet, cost))
    return plan


def _meets(s: dict, target: float) -> bool:
    """The run kept SLO attainment at the target, with no more refused or failed than the target allows."""
    return (s["slo_attainment"] or 0.0) >= target and (s["refused"] + s["failed"]) <= (1 - target) * s["requests"]


def _metered(run: Callable[[Fleet], dict], target: float, plan: Plan,
             emit: Callable[[str], None] | None) -> Callable[[Fleet], tuple[bool, dict]]:
    """``run`` as a verdict: counts the run in ``plan.trials`` and reports a progress line to ``emit``."""
    def meets(fleet: Fleet) -> tuple[bool, dict]:
        s = run(fleet)
        plan.trials += 1
        ok = _meets(s, target)
        if emit is not None:
            emit(f"{label(fleet)}: SLO {100 * (s['slo_attainment'] or 0):.1f}% -> {'ok' if ok else 'short'}")
        return ok, s

    return meets


@dataclass(frozen=True)
class _Twin:
    """One fleet's twin run at the stressed load (a picklable callable: it also runs in worker processes)."""

    model: str
    tp: int
    base_fleet: dict
    stressed: Mapping[str, Any]
    base_dir: Path | None
    seed: int
    duration_s: float | None
    policy: str

    def __call__(self, fleet: Fleet) -> dict:
        cfg = parse_fleet(_fleet_doc(fleet, self.model, self.tp, self.base_fleet), f"plan {label(fleet)}")
        return Experiment(cfg, self.stressed, self.base_dir, self.seed, self.duration_s).run(self.policy)


def _search_one(args: tuple) -> tuple[tuple[int, dict] | None, dict[str, str], int, list[str]]:
    """A worker process: one GPU type's search; (what it found, why not, twin runs, progress lines)."""
    name, twin, target, max_replicas = args
    scratch = Plan("", target, 0.0, 0.0)
    lines: list[str] = []
    found = _smallest(name, _metered(twin, target, scratch, lines.append), scratch, max_replicas)
    return found, scratch.infeasible, scratch.trials, lines


def _search_in_parallel(names: list[str], twin: _Twin, target: float, max_replicas: int, workers: int, plan: Plan,
                        progress: Callable[[str], None] | None) -> dict[str, tuple[int, dict] | None]:
    """The single-type searches, one process per type: forked when this process runs one thread (the kernels and
    the trace are already loaded), else spawned (forking beside other threads can copy a lock they hold)."""
    import multiprocessing
    import threading
    from concurrent.futures import ProcessPoolExecutor

    out: dict[str, tuple[int, dict] | None] = {}
    ctx = multiprocessing.get_context("fork" if threading.active_count() == 1 else "spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(names)), mp_context=ctx) as pool:
        results = pool.map(_search_one, [(name, twin, target, max_replicas) for name in names])
        for name, (found, why, trials, lines) in zip(names, results):  # in the order asked: the same plan
            out[name] = found
            plan.infeasible.update(why)
            plan.trials += trials
            if progress is not None:
                for line in lines:
                    progress(line)
    return out


def _smallest(name: str, meets: Callable[[Fleet], tuple[bool, dict]], plan: Plan,
              max_replicas: int) -> tuple[int, dict] | None:
    """The smallest count of ``name`` replicas that meets the target (exponential search, then bisection), or
    None with the reason in ``plan.infeasible``."""
    lo, hi, last = 0, 1, -1.0
    while True:  # exponential search for a count that meets the target
        try:
            ok, s = meets(((name, hi),))
        except ValueError as e:  # the model does not fit this GPU at this tp
            plan.infeasible[name] = str(e)
            return None
        if ok:
            best = (hi, s)
            break
        got = s["slo_attainment"] or 0.0
        if hi >= 4 and got <= last + _PLATEAU:
            plan.infeasible[name] = (f"the SLO is out of reach on {name}: attainment plateaus at {100 * got:.1f}% "
                                     f"with {hi} replicas (requests too long for its targets)")
            return None
        last = got
        lo = hi
        if hi >= max_replicas:  # max_replicas itself was tried, not just the last power of two below it
            plan.infeasible[name] = f"not enough with {max_replicas} replicas"
            return None
        hi = min(hi * 2, max_replicas)
    while hi - lo > 1:  # bisection between the last short count and the first enough
        mid = (lo + hi) // 2
        ok, s = meets(((name, mid),))
        if ok:
            hi, best = mid, (mid, s)
        else:
            lo = mid
    return best
