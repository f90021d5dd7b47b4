"""Brown-out: when the fleet is saturated, sheddable traffic steps aside before critical traffic suffers.

Brown-out is per model: on for a model while the gateway queue holds at least
``brownout_queue_depth`` requests *for it* and none of its replicas can take one
(its replicas have been full for a while; a short burst only queues, and the
queue's own order and shedding handle it).  Another model's backlog says nothing
about this one.  Then a request of the *sheddable* class is moved to the cheaper
model named in ``brownout_models`` (when the fleet serves it and one of its
replicas can take it: in rotation, under its concurrency limit, not saturated
per the scheduler's saturation detector), or refused with 503 and
``Retry-After`` — before it takes a queue place critical traffic needs.  Other
classes are untouched (batch waits in the queue and is shed first there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from steersman.config.reliability import ReliabilitySettings
from steersman.policy.request import PriorityClass

__all__ = ["Keep", "MoveTo", "Shed", "brownout"]


@dataclass(frozen=True, slots=True)
class Keep:
    pass


@dataclass(frozen=True, slots=True)
class MoveTo:
    model: str


@dataclass(frozen=True, slots=True)
class Shed:
    reason: str
    retry_after: float = 1.0


KEEP = Keep()


def brownout(priority: PriorityClass, model: str, queue_depth: int, saturated: Callable[[str], bool],
             serves: Callable[[str], bool], settings: ReliabilitySettings, movable: bool = True) -> Keep | MoveTo | Shed:
    """What brown-out does with one request for ``model``, whose replicas are all full (the caller asks only
    then: ``steersman.pipeline.brownout``); ``queue_depth``: the requests waiting in the gateway for ``model``;
    ``saturated(model)`` (no replica can take a request) / ``serves(model)`` ask the fleet snapshot;
    ``movable``: another model's answer would do (not for embeddings: another model's vectors are not comparable)."""
    if priority != PriorityClass.SHEDDABLE:
        return KEEP
    if queue_depth < settings.brownout_queue_depth:
        return KEEP
    cheaper = settings.brownout_models.get(model)
    if movable and cheaper is not None and cheaper != model and serves(cheaper) and not saturated(cheaper):
        return MoveTo(cheaper)
    return Shed(f"the fleet is saturated: sheddable traffic for {model!r} is browned out")
