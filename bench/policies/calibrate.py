"""Find the load near saturation: measure the fleet's capacity for a workload, by simulation.

**Capacity** of the fleet for a workload = the highest request rate any probed
policy *sustains* when offered more than it can serve.  A run's sustained rate
is the completions between the 10th and 90th percentile of completion times
divided by that span: in overload the fleet is busy throughout and this is its
service rate (warm-up and the final drain are cut off); without overload it is
the offered rate.

The probe starts at the workload's own rate (``load`` 1), multiplies the load by
3 while the first probe policy keeps up, then runs every probe policy at that
overload; if one of them still keeps up, the load doubles (at most
``max_rounds`` runs per policy).  A run *keeps up* when it sustains >= 80% of the
rate requests arrived at and >= 80% of them met their SLO (closed-loop agents
slow their own arrivals down when served late, so the rate alone cannot tell).
The offered rate at ``load`` 1 is measured in the first run (arrivals / their
span) and assumed proportional to ``load``.  The bench then runs every
policy at ``target`` (default 0.9) × capacity: the best policy near ~90% of what
the fleet can do with it, the others wherever that puts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from steersman.twin.metrics import slo_met
from steersman.twin.results import OK
from steersman.twin.run import Experiment

__all__ = ["sustained_rps", "offered_window_goodput", "Capacity", "probe"]

KEEPS_UP = 0.8


def sustained_rps(rec) -> float:
    c = rec.arrays()
    t = np.sort(c["finish"][c["status"] == OK])
    if t.size < 10:
        return 0.0
    lo, hi = np.percentile(t, [10, 90])
    n = int(((t >= lo) & (t <= hi)).sum())
    return n / (hi - lo) if hi > lo else 0.0


def offered_window_goodput(rec) -> float:
    """Requests that met their SLO per second of the offered window (first to last arrival)."""
    c = rec.arrays()
    t = c["arrival"]
    if t.size < 2 or t.max() <= t.min():
        return 0.0
    return float(slo_met(c).sum() / (t.max() - t.min()))


@dataclass
class Capacity:
    offered_rps_at_1x: float  # the workload's own arrival rate (measured at load 1)
    probe_load: float = 1.0  # the overload the capacity was measured at
    capacity_rps: float = 0.0
    best_policy: str = ""
    sustained: dict[str, float] = field(default_factory=dict)  # policy -> sustained req/s at probe_load
    runs: int = 0

    def load_for(self, target: float) -> float:
        """The load multiplier that offers ``target`` x capacity."""
        return target * self.capacity_rps / self.offered_rps_at_1x

    def as_json(self, target: float) -> dict:
        return {"offered_rps_at_1x": self.offered_rps_at_1x, "probe_load": self.probe_load,
                "capacity_rps": self.capacity_rps, "best_policy_at_capacity": self.best_policy,
                "sustained_rps_at_probe": self.sustained, "target_share": target,
                "load": self.load_for(target), "offered_rps": target * self.capacity_rps, "probe_runs": self.runs}


def _arrival_rps(rec) -> float:
    t = rec.arrays()["arrival"]
    return float((t.size - 1) / (t.max() - t.min())) if t.size > 1 and t.max() > t.min() else 0.0


def probe(exp: Experiment, policies: list[str], max_rounds: int = 5, log=print) -> Capacity:
    cap = Capacity(0.0)

    def run(policy: str, load: float) -> tuple[float, bool]:
        s = exp.run(policy, load)
        cap.runs += 1
        x, arr = sustained_rps(exp.last), _arrival_rps(exp.last)
        if not cap.offered_rps_at_1x:
            cap.offered_rps_at_1x = arr / load
        keeps = x >= KEEPS_UP * arr and (s["slo_attainment"] or 0.0) >= KEEPS_UP
        log(f"    probe {policy:<20} load {load:7.3g}x: arrivals {arr:8.3g} req/s, sustained {x:8.3g} req/s, "
            f"SLO {100 * (s['slo_attainment'] or 0):5.1f}%{'' if keeps else '  (saturated)'}", flush=True)
        return x, keeps

    load, first = 1.0, policies[0]
    for _ in range(max_rounds):
        x, keeps = run(first, load)
        if not keeps:
            break
        load *= 3.0
    results = {first: (x, keeps)}
    for p in policies[1:]:
        results[p] = run(p, load)
    for _ in range(max_rounds):
        if not any(k for _, k in results.values()):
            break
        load *= 2.0
        results = {p: run(p, load) for p in policies}
    cap.sustained = {p: x for p, (x, _) in results.items()}
    cap.probe_load = load
    cap.best_policy = max(cap.sustained, key=cap.sustained.get)
    cap.capacity_rps = cap.sustained[cap.best_policy]
    return cap
