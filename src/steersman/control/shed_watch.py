"""Early rejection for requests that wait in the gateway queue (``SchedulerSettings.shed_infeasible``).

The policy refuses a request of an early-rejection class that no replica is predicted to serve within its SLO
(Mooncake's early rejection, ``policy/model_based.py`` ``shed``), but it is asked only when a request is routed:
one that arrived while others waited for its model went into the queue unasked, below every more important band,
and was refused on its turn, after its TTFT budget had long run out (an audit with 40 standard clients on two
replicas: sheddable requests waited 17-22 s for their 503; the README says "refused at once").  So such a request
is asked at arrival all the same (:meth:`ControlPlane.arrive`: refused then if the policy refuses it, else queued
as before), and asked again when its TTFT budget runs out while it waits (:class:`ShedWatch`, from the plane's
expiry pass every 50 ms): a profile that sheds (steersman's) refuses it then; one that does not keeps it queued.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from steersman.policy.request import PriorityClass, SchedRequest

__all__ = ["ShedWatch", "REASK_S"]

#: a queued request whose budget ran out with no replica to predict over (all ejected or down) is asked again this
#: much later (design: once a second; a replica back from a blip, or the queue's own expiry, answers first)
REASK_S = 1.0


class ShedWatch:
    """The queued requests of the early-rejection classes, by when their TTFT budget runs out."""

    def __init__(self, classes: frozenset[PriorityClass]) -> None:
        self.classes = classes  # the picker's (SloCheapest.shed, from scheduler.shed_infeasible): not parsed twice
        self._due: list[tuple[float, int, Any]] = []
        self._seq = itertools.count()

    def applies(self, req: SchedRequest) -> bool:
        """``req`` may be refused early: its class is one of them, it is not protected (critical, sunk cost) and
        not a stream under way (the policy's own conditions), and it has a TTFT budget."""
        return (req.priority in self.classes and req.protection <= 0 and not req.resumed
                and req.budget.ttft_s is not None)

    def watch(self, item: Any, req: SchedRequest) -> None:
        """``item`` (``req``, which :meth:`applies`) waits in the queue from now."""
        heapq.heappush(self._due, (req.arrival + req.budget.ttft_s, next(self._seq), item))

    def due(self, now: float, most: int, waiting: Callable[[Any], bool]) -> list[Any]:
        """At most ``most`` of the watched items still ``waiting`` whose TTFT budget has run out by ``now``, earliest
        first (each once); the others stay due for the next pass (each asks the policy a prediction).  Items that left
        the queue are dropped as they come up, not counted (a review: dispatched ones filled the bound, and one that
        had waited its budget out waited more passes for its 503)."""
        out = []
        heap = self._due
        while heap and heap[0][0] <= now and len(out) < most:
            item = heapq.heappop(heap)[2]
            if waiting(item):
                out.append(item)
        return out

    def again(self, item: Any, at: float) -> None:
        """Ask about ``item`` again at ``at`` (the policy had no replica to predict over: all ejected or down)."""
        heapq.heappush(self._due, (at, next(self._seq), item))
