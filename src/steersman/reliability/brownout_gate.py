"""The brown-out gate: which sheddable request brown-out moves to a cheaper model or sheds, per model, with its
hysteresis (:mod:`steersman.reliability.brownout`), as the live gateway's ``brownout`` stage and the digital twin
both ask it.  It keeps the models in brown-out (since when, when their backlog was last deep) and is told the time;
the fleet is read from a snapshot, made only when a decision needs one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from steersman.config.reliability import ReliabilitySettings
from steersman.config.scheduler import SchedulerSettings
from steersman.policy.request import PriorityClass, SchedRequest
from steersman.policy.saturation import saturated
from steersman.policy.scorers import model_holds, sequence_tokens
from steersman.reliability.brownout import BrownoutState, Keep, MoveTo, Shed, browned_out, brownout

__all__ = ["BrownoutGate", "full", "holds"]

log = logging.getLogger("steersman.pipeline.brownout")


def full(snap, model: str, settings: SchedulerSettings) -> bool:
    """No replica of ``model`` can take a request now: none is in rotation (healthy, warm, and not ejected nor
    behind an open breaker: the guard's panic routing would send a moved request to a replica it took out for
    failing), and each left is at its adaptive concurrency limit or saturated."""
    idx = snap.candidates(model)
    if idx.size and snap.blocked_until is not None:
        idx = idx[snap.blocked_until[idx] <= snap.time]
    if idx.size and snap.limits is not None:
        idx = idx[snap.in_flight[idx] < snap.limits[idx]]
    return idx.size == 0 or bool(saturated(snap, idx, settings).all())


def holds(snap, model: str, req: SchedRequest) -> bool:
    """Some replica serving ``model`` could ever hold ``req`` (its longest prompt and ``max_tokens``): the routing's
    own context check (:func:`steersman.policy.scorers.model_holds`), asked before a move: a request moved to a
    model none of whose replicas holds it was refused there with a 400 ``context_length_exceeded`` for a model its
    client never asked for."""
    return model_holds(snap, model, sequence_tokens(req))


class BrownoutGate:
    def __init__(self, reliability: ReliabilitySettings, scheduler: SchedulerSettings) -> None:
        self.rel = reliability
        self.settings = scheduler
        self.depth = reliability.brownout_queue_depth
        #: the models in brown-out now (a model leaves once its backlog has been short for the stabilization window)
        self.states: dict[str, BrownoutState] = {}

    def decide(self, req: SchedRequest, depth: int, snapshot: Callable[[], object], serves: Callable[[str], bool],
               now: float, movable: bool = True) -> Keep | MoveTo | Shed | None:
        """What brown-out does with ``req`` (for ``req.model``, ``depth`` requests waiting in the gateway for that
        model): None when it is not sheddable or its model is not in brown-out (the fast path: no snapshot made)."""
        if req.priority != PriorityClass.SHEDDABLE:
            return None
        model = req.model
        was = self.states.get(model)
        if was is None and depth < self.depth:
            return None  # not in brown-out, and this model's backlog is short (whatever other models' is)
        snap = snapshot()
        settings = self.settings
        state = browned_out(was, depth, lambda: full(snap, model, settings), now, self.rel)
        if state is None:
            if was is not None:
                del self.states[model]
                log.info("brown-out of %r ends after %.0f s (%d requests wait for it)", model, now - was.since, depth)
            return None  # a replica of its own can take it (the queue drains), or the brown-out is over
        if was is None:
            log.info("brown-out of %r begins: %d requests wait for it, none of its replicas can take one", model, depth)
        self.states[model] = state
        return brownout(req.priority, model, depth, lambda m: full(snap, m, settings), serves, self.rel,
                        movable=movable, on=True, holds=lambda m: holds(snap, m, req))
