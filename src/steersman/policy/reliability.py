"""The ``reliability`` filter: the first step of every scheduling profile (the framework adds it, not plugins).

It keeps only candidates that are routable (healthy, weights warm — a cold or
loading replica never gets traffic), not ejected or behind an open circuit
breaker (``snapshot.blocked_until``), under their adaptive concurrency limit
(``snapshot.limits`` against the gateway's in-flight count), and not excluded
for this request (replicas a retry must avoid, ``request.excluded``).

When nothing passes, :meth:`ReliabilityFilter.empty` says why: *queue* when
some replica is only at its concurrency limit (capacity frees as requests
finish), else *reject* with ``Retry-After`` = the time until the first blocked
replica returns (at least 1 s).
"""

from __future__ import annotations

import math

import numpy as np

from steersman.policy.base import Decision, Queue, Reject
from steersman.policy.framework import FILTERS, DecisionContext

__all__ = ["ReliabilityFilter", "RELIABILITY"]


@FILTERS.register("reliability")
class ReliabilityFilter:
    name = "reliability"

    def _hard(self, ctx: DecisionContext) -> np.ndarray:
        snap = ctx.snapshot
        c = ctx.candidates
        keep = snap.routable[c]  # a fancy index: already a copy
        if snap.blocked_until is not None:
            keep &= snap.blocked_until[c] <= snap.time
        ex = ctx.request.excluded
        if ex:
            keep &= ~np.isin(c, np.fromiter(ex, dtype=np.intp, count=len(ex)))
        return keep

    def filter(self, ctx: DecisionContext) -> np.ndarray:
        keep = self._hard(ctx)
        snap = ctx.snapshot
        if snap.limits is not None:  # whole limits (the fleet floors them)
            c = ctx.candidates
            keep &= snap.in_flight[c] < snap.limits[c]
        return keep

    def empty(self, ctx: DecisionContext) -> Decision:
        """The decision when no candidate passed :meth:`filter`."""
        if self._hard(ctx).any():
            return Queue("every available replica is at its adaptive concurrency limit")
        snap = ctx.snapshot
        wait = 1.0
        if snap.blocked_until is not None and ctx.candidates.size:
            soonest = float(np.min(snap.blocked_until[ctx.candidates])) - snap.time
            if math.isfinite(soonest):
                wait = max(1.0, soonest)
        return Reject(f"no available replica serves model {ctx.request.model!r} (ejected, breaker open or excluded)",
                      retry_after=wait)


RELIABILITY = ReliabilityFilter()
