"""The ``reliability`` filter: the first step of every scheduling profile (the framework adds it, not plugins).

It keeps only candidates that are routable (healthy, weights warm — a cold or
loading replica never gets traffic), not ejected or behind an open circuit
breaker (``snapshot.blocked_until``), under their adaptive concurrency limit
(``snapshot.limits`` against the gateway's in-flight count; not for a stream being
resumed elsewhere, whose load was admitted already), and not excluded
for this request (replicas a retry must avoid, ``request.excluded``).

When the guard has taken every replica of the model that would pass out of rotation (ejected, breaker open;
none merely at its concurrency limit), the request goes to those replicas anyway: Envoy's panic mode (``healthy_panic_threshold``: below it the load
balancer ignores health and routes to all hosts).  An outage of the guard's making (a 1 s blip ejecting a
model's only replica for 30 s, or its two replicas one ejected and one behind an open breaker) is not
the whole model's; a dead replica fails fast and the request's retry budget decides the rest.

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
from steersman.policy.plugin_kernels import reliability_kernel

__all__ = ["ReliabilityFilter", "RELIABILITY", "excluded_array"]

_NONE = np.empty(0)  # no blocked_until / limits: the kernel skips that check
_NONE.flags.writeable = False
_NO_EXCLUDED = np.empty(0, dtype=np.intp)
_NO_EXCLUDED.flags.writeable = False


def excluded_array(excluded: frozenset[int]) -> np.ndarray:
    """``request.excluded`` as the kernels take it: a read-only intp array, like every other array they read.

    Numba compiles one machine-code version per argument *type*, and a writable array is another type than a
    read-only one: a writable ``excluded`` on a retry or stream continuation made the first one after start
    compile (or load) the kernel again on the event loop, stalling every stream (~0.9 s on a cold cache)."""
    if not excluded:
        return _NO_EXCLUDED
    a = np.fromiter(excluded, dtype=np.intp, count=len(excluded))
    a.flags.writeable = False
    return a


def _keep(ctx: DecisionContext, limits: bool, blocked: bool = True) -> np.ndarray:
    """One compiled pass over the candidates (see :func:`~steersman.policy.kernels.reliability_kernel`);
    ``blocked`` False: ejections and open breakers ignored (panic)."""
    snap, c = ctx.snapshot, ctx.candidates
    ex = ctx.request.excluded
    until = snap.blocked_until if blocked else None
    if until is None and (not limits or snap.limits is None) and not ex:
        return snap.routable[c]  # nothing else to check (no guard): one gather, a copy
    out = np.empty(c.size, dtype=np.bool_)
    reliability_kernel(c, snap.routable, _NONE if until is None else until, snap.time,
                       snap.in_flight, _NONE if not limits or snap.limits is None else snap.limits,
                       excluded_array(ex), out)
    return out


@FILTERS.register("reliability")
class ReliabilityFilter:
    name = "reliability"

    def filter(self, ctx: DecisionContext) -> np.ndarray:
        """Routable, not blocked, not excluded and (whole limits: the fleet floors them) under the limit (unless
        the request is a stream being resumed: see :attr:`SchedRequest.resumed`)."""
        limits = not ctx.request.resumed
        keep = _keep(ctx, limits)
        if ctx.snapshot.blocked_until is not None and not keep.any() and not _keep(ctx, limits=False).any():
            keep = _keep(ctx, limits, blocked=False)  # panic (nothing to wait for but the guard): see the module doc
        return keep

    def available(self, ctx: DecisionContext) -> np.ndarray:
        """:meth:`filter` with the concurrency limits left out: the replicas that would take the request once
        capacity frees (what early rejection predicts over for a request that waits: at the limit is saturated)."""
        keep = _keep(ctx, limits=False)
        if ctx.snapshot.blocked_until is not None and not keep.any():
            keep = _keep(ctx, limits=False, blocked=False)  # panic, as filter()
        return keep

    def empty(self, ctx: DecisionContext) -> Decision:
        """The decision when no candidate passed :meth:`filter`."""
        if _keep(ctx, limits=False).any():
            return Queue("every available replica is at its adaptive concurrency limit")
        snap = ctx.snapshot
        wait = None  # none known: the control plane's (scheduler.no_replica_retry_after_s)
        if snap.blocked_until is not None and ctx.candidates.size:
            soonest = float(np.min(snap.blocked_until[ctx.candidates])) - snap.time
            if math.isfinite(soonest):
                wait = max(1.0, soonest)  # (a whole second at least: the header's unit)
        return Reject(f"no available replica serves model {ctx.request.model!r} (ejected, breaker open or excluded)",
                      retry_after=wait)


RELIABILITY = ReliabilityFilter()
