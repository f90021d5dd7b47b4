"""Brown-out: when the fleet is saturated, sheddable traffic steps aside before critical traffic suffers.

Brown-out is on while the gateway queue holds at least ``brownout_queue_depth``
requests: every replica has been saturated for a while (a short burst only
queues; the queue's own order and shedding handle it).  Then a request of the
*sheddable* class is moved to the cheaper model named in ``brownout_models``
(when the fleet serves it and that model's replicas are not all saturated, per
the scheduler's saturation detector), or refused with 503 and ``Retry-After`` —
before it takes a queue place critical traffic needs.  Other classes are
untouched (batch waits in the queue and is shed first there).
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
    """What brown-out does with one request; ``saturated(model)`` / ``serves(model)`` ask the fleet snapshot;
    ``movable``: another model's answer would do (not for embeddings: another model's vectors are not comparable)."""
    if priority != PriorityClass.SHEDDABLE:
        return KEEP
    if queue_depth < settings.brownout_queue_depth:
        return KEEP
    cheaper = settings.brownout_models.get(model)
    if movable and cheaper is not None and cheaper != model and serves(cheaper) and not saturated(cheaper):
        return MoveTo(cheaper)
    return Shed(f"the fleet is saturated: sheddable traffic for {model!r} is browned out")
