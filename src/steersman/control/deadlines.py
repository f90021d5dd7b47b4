"""What a deadline check predicts (:meth:`steersman.control.plane.ControlPlane.arrive` and ``expire``): the
earliest a request could finish on the fleet as it is, and what it would take alone on an idle replica.  Pure:
functions of a frozen fleet snapshot, predicted with the scheduler settings the routing decisions use (a replica
without a hardware profile is predicted from their ``unprofiled_*`` priors)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from steersman.config import SchedulerSettings
from steersman.fleet import snapshot as S
from steersman.fleet.snapshot import FleetSnapshot
from steersman.policy.framework import DecisionContext
from steersman.policy.request import SchedRequest

__all__ = ["earliest_finish", "alone"]


def earliest_finish(snapshot: FleetSnapshot, req: SchedRequest, settings: SchedulerSettings) -> float:
    """Best predicted completion time over every candidate, ignoring saturation (a lower bound)."""
    idx = snapshot.candidates(req.model)
    if idx.size == 0:
        return np.inf
    pred = DecisionContext(snapshot, req, idx, settings=settings).feature("prediction")
    return snapshot.time + float(np.min(pred.e2e))


#: the live rows that are load (engine-reported and the gateway's own), zero on an idle replica
_LOAD_ROWS = [S.IN_FLIGHT, S.RUNNING, S.WAITING, S.KV_USAGE, S.PENDING_PREFILL, S.DECODING, S.ACTIVE_BLOCKS,
              S.RECENT_TOKENS, S.SINCE_SCRAPE, S.RESIDENT_TPOT, S.FAIL_SHARE, S.PENDING_PAIRS, S.AWAITING]


def alone(snapshot: FleetSnapshot, req: SchedRequest, settings: SchedulerSettings) -> float:
    """The request's predicted run time on its best candidate were every replica idle: each keeps its speed
    (learnt corrections, engine timing) and its cached prefixes, and loses its load.  A deadline window shorter
    than this is one no retry with the same window meets, however much the fleet drains: asked only of a
    request already refused (the refusal then says so, not "retry later")."""
    idx = snapshot.candidates(req.model)
    if idx.size == 0:
        return np.inf
    live = snapshot.live.copy()
    live[_LOAD_ROWS] = 0.0
    live[S.STALLED_SINCE] = np.nan
    # a trace of a running request keeps each replica's learnt TPOT ratio: the kernel gives a replica with nothing
    # running the fleet's prior, slower than a fast replica's own (its "alone" read 3.2 s where loaded it read 1.9 s)
    live[S.RUNNING] = np.where(np.isfinite(snapshot.live[S.TPOT_RATIO]), 1e-9, 0.0)
    idle = replace(snapshot, live=live, recent_at=None)
    learnt = float(np.min(DecisionContext(idle, req, idx, settings=settings).feature("prediction").e2e))
    # and as the model has it, uncorrected: a correction learnt under overload can hold the engine's own queueing
    # (its slots full), which an idle replica does not have; the 400 it gave was final and wrong (a scheduling
    # audit: 0.81 s requests read 1.53 s "alone" on an idle fleet, every deadline up to 1.5 s refused for good).
    # The lesser of the two: the request alone misses its window only if both say so (else a retryable 503)
    raw = live.copy()
    raw[[S.TTFT_RATIO, S.TPOT_RATIO]] = 1.0
    raw[S.RUNNING] = 1e-9
    uncorrected = DecisionContext(replace(idle, live=raw), req, idx, settings=settings)
    model = float(np.min(uncorrected.feature("prediction").e2e))
    return min(learnt, model)
