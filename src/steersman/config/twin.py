"""Settings of the digital twin's run loop (``steersman simulate``, ``bench/twin``) and its planner (``steersman plan``)."""

from __future__ import annotations

from dataclasses import dataclass

from steersman.config._base import check_bounds, setting

__all__ = ["TwinSettings"]


@dataclass(frozen=True, slots=True)
class TwinSettings:
    gc_threshold0: int = setting(
        200_000, "bench/twin: a young collection every 200k allocations instead of Python's 700 (the loop allocates "
        "short-lived events by the million; the start-up heap is frozen with gc.freeze for the run)", ge=1)
    gc_threshold1: int = setting(50, "bench/twin: with gc_threshold0 (Python's default: 10)", ge=1)
    gc_threshold2: int = setting(1000, "bench/twin: with gc_threshold0 (Python's default: 10)", ge=1)
    plan_slo: float = setting(0.99, "steersman plan: share of requests that must meet their SLO class targets (two nines)", gt=0, le=1)
    plan_headroom: float = setting(
        0.2, "steersman plan: size for the peak load x 1.2 (design: a fleet run near 80% of what it can serve keeps "
        "its queues short when the load rises before a scale-up lands)")
    plan_max_replicas: int = setting(512, "steersman plan: the exponential search gives up on a GPU type past 512 replicas", ge=1)
    plan_mixed_trials: int = setting(
        6, "steersman plan: two-type fleets simulated after the single-type searches, cheapest first "
        "(examples/copilot-peak.yaml: the cheaper mixes tried, 6 x A100 + 1 x L40S among them, fell short of the 99%)")
    plan_workers: int = setting(
        1, "steersman plan --workers: GPU types searched in that many processes at once (design: one by default, "
        "so a plan uses one core like a simulation; each search is a chain of runs that depend on each other)", ge=1)

    def __post_init__(self) -> None:
        check_bounds(self)
