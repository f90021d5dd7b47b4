"""Brown-out: when the fleet is saturated, sheddable traffic steps aside before critical traffic suffers.

Brown-out is per model: it begins for a model when the gateway queue holds at
least ``brownout_queue_depth`` requests *for it* and none of its replicas can take
one (its replicas have been full for a while; a short burst only queues, and the
queue's own order and shedding handle it).  Another model's backlog says nothing
about this one.  Then a request of the *sheddable* class is moved to the cheaper
model named in ``brownout_models`` (when the fleet serves it and one of its
replicas can take it: in rotation, under its concurrency limit, not saturated
per the scheduler's saturation detector), or refused with 503 and
``Retry-After`` — before it takes a queue place critical traffic needs.  Other
classes are untouched (batch waits in the queue and is shed first there).

Brown-out has hysteresis (:func:`browned_out`; the caller keeps the state and
passes the time in): it ends only once the backlog has been below
``brownout_leave_fraction`` of that depth for ``brownout_stabilization_s``
(Envoy's watermark buffers: low = high / 2; Kubernetes HPA's 300 s scale-down
stabilization window).  With one threshold, a
backlog hovering at it flipped a conversation's consecutive turns between the two
models, each turn missing the other model's prefix cache.  While it lasts, a
replica of the model freeing a slot for an instant does not end it (the backlog
takes that slot).  In the window's tail (the backlog already short) a request that
cannot move is kept, not shed: there is no queue place left to protect.

A request the cheaper model cannot hold at all (``holds``: its longest prompt and
``max_tokens`` over the whole KV cache of every replica serving it, the routing's
own context check) is not moved: routing would refuse it with a 400
``context_length_exceeded`` for a model it never asked for.  It is sheddable work
that cannot step aside, as when no cheaper model is named: refused with 503 and
``Retry-After`` (kept in the stabilization window's tail) -- kept on its own model,
the heaviest sheddable requests would be the ones to take the saturated queue's places.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from steersman.config.reliability import ReliabilitySettings
from steersman.policy.request import PriorityClass

__all__ = ["BrownoutState", "Keep", "MoveTo", "Shed", "browned_out", "brownout", "leave_depth"]


@dataclass(frozen=True, slots=True)
class Keep:
    pass


@dataclass(frozen=True, slots=True)
class MoveTo:
    model: str


@dataclass(frozen=True, slots=True)
class Shed:
    reason: str  # (answered 503 brownout with scheduler.no_replica_retry_after_s)


KEEP = Keep()


@dataclass(frozen=True, slots=True)
class BrownoutState:
    """A model in brown-out: since when, and when its backlog was last seen at or above the leave depth."""

    since: float
    deep_at: float


def leave_depth(settings: ReliabilitySettings) -> float:
    """The backlog below which a brown-out may end (the band's low edge): ``brownout_leave_fraction`` of
    ``brownout_queue_depth``."""
    return settings.brownout_queue_depth * settings.brownout_leave_fraction


def browned_out(state: BrownoutState | None, queue_depth: int, full: Callable[[], bool], now: float,
                settings: ReliabilitySettings) -> BrownoutState | None:
    """Whether a model is in brown-out after this observation: its state before (None: not in brown-out),
    ``queue_depth`` the requests waiting in the gateway for it, ``full()`` none of its replicas can take one
    (asked only to begin one), ``now`` the clock's time.

    * Not in brown-out: it begins when ``queue_depth >= brownout_queue_depth`` and ``full()``.
    * In brown-out: it goes on while ``queue_depth >= leave_depth(settings)`` (a slot a replica frees goes to the
      backlog: ``full()`` is not asked again), and ends once the backlog has stayed below that depth for
      ``brownout_stabilization_s`` (Kubernetes HPA's scale-down stabilization: the highest recommendation over the
      window wins)."""
    if state is None:
        if queue_depth >= settings.brownout_queue_depth and full():
            return BrownoutState(now, now)
        return None
    if queue_depth >= leave_depth(settings):
        return BrownoutState(state.since, now)
    if now - state.deep_at < settings.brownout_stabilization_s:
        return state
    return None


def brownout(priority: PriorityClass, model: str, queue_depth: int, saturated: Callable[[str], bool],
             serves: Callable[[str], bool], settings: ReliabilitySettings, movable: bool = True, *,
             on: bool | None = None, holds: Callable[[str], bool] | None = None) -> Keep | MoveTo | Shed:
    """What brown-out does with one request for ``model`` while it is in brown-out (``on``; the caller keeps that
    state: ``steersman.pipeline.brownout``); ``queue_depth``: the requests waiting in the gateway for ``model``;
    ``saturated(model)`` (no replica can take a request) / ``serves(model)`` ask the fleet snapshot;
    ``movable``: another model's answer would do (not for embeddings: another model's vectors are not comparable).

    ``on``: whether ``model`` is in brown-out (:func:`browned_out`, kept by the caller); None judges the backlog
    alone (``queue_depth >= brownout_queue_depth``).  ``holds(model)``: some replica serving ``model`` could ever
    hold this request (None: any could); one the cheaper model cannot hold is not moved (then shed, as any that
    cannot move)."""
    if priority != PriorityClass.SHEDDABLE:
        return KEEP
    if on is None:
        on = queue_depth >= settings.brownout_queue_depth
    if not on:
        return KEEP
    cheaper = settings.brownout_models.get(model)
    # one the cheaper model cannot hold is not moved (it would be a 400 for a model it never asked for): it is
    # sheddable work that cannot step aside, as when there is no cheaper model
    if (movable and cheaper is not None and cheaper != model and serves(cheaper)
            and (holds is None or holds(cheaper)) and not saturated(cheaper)):
        return MoveTo(cheaper)
    if queue_depth < leave_depth(settings):
        return KEEP  # the stabilization window's tail: the backlog is short, no queue place to protect
    return Shed(f"the fleet is saturated: sheddable traffic for {model!r} is browned out")
