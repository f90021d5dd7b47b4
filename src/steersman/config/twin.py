"""Settings of the digital twin's run loop (``steersman simulate``, ``bench/twin``)."""

from __future__ import annotations

from dataclasses import dataclass

from steersman.config._base import setting

__all__ = ["TwinSettings"]


@dataclass(frozen=True, slots=True)
class TwinSettings:
    gc_threshold0: int = setting(
        200_000, "bench/twin: a young collection every 200k allocations instead of Python's 700 (the loop allocates "
        "short-lived events by the million; the start-up heap is frozen with gc.freeze for the run)")
    gc_threshold1: int = setting(50, "bench/twin: with gc_threshold0 (Python's default: 10)")
    gc_threshold2: int = setting(1000, "bench/twin: with gc_threshold0 (Python's default: 10)")
