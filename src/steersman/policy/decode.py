"""Where a disaggregated request decodes: the prefill/decode hand-off as a policy over the fleet snapshot.

With prefill/decode disaggregation (:mod:`steersman.twin.pd`) a request is routed twice: the routing
policy places it on a prefill (or colocated) replica, and once its prompt is computed its KV moves to a
decode replica of the same model.  The second choice is this extension point, a pure function of the
fleet snapshot like the first (no IO, no clock), so the twin runs it as the control plane would.

Decode replicas appear in the snapshot under the model name :func:`decode_model` gives (``<model>@decode``),
which no request asks for: the routing policy never places new work on them.  The fleet accounts each
hand-off on its decode replica from the pick to the request's end, so ``IN_FLIGHT`` there is the number of
requests handed to it and not finished.

Pickers are registered by name in :data:`DECODE_PICKERS` and chosen with the scheduler setting
``decode_picker`` (``DEFAULTS.scheduler.decode_picker``; a fleet file's ``scheduler: {decode_picker: ...}``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from steersman.fleet import snapshot as S
from steersman.fleet.snapshot import FleetSnapshot
from steersman.plugins import Registry
from steersman.policy.base import Reject, Route
from steersman.policy.request import SchedRequest

__all__ = ["DecodePicker", "DECODE_PICKERS", "LeastLoadedDecode", "decode_model", "make_decode_picker"]

_SUFFIX = "@decode"


def decode_model(model: str) -> str:
    """The name decode replicas of ``model`` are listed under in the fleet (and its snapshots)."""
    return model + _SUFFIX


@runtime_checkable
class DecodePicker(Protocol):
    name: str

    def pick_decode(self, snapshot: FleetSnapshot, request: SchedRequest, prefill: int) -> Route | Reject:
        """The decode replica for ``request``, whose prompt replica ``prefill`` computed; must not do IO or read
        the clock.  :class:`Reject` when no decode replica can take it (the request then fails)."""
        ...


#: Decode pickers by name: ``factory() -> DecodePicker``.
DECODE_PICKERS: Registry = Registry("decode picker", DecodePicker)


def _available(snap: FleetSnapshot, model: str) -> np.ndarray:
    """Decode replicas of ``model`` that are routable (:meth:`FleetSnapshot.candidates`) and not out of rotation
    (ejected, breaker open), ascending; every routable one when the guard has taken them all out of rotation:
    the panic mode of the routing gate (:class:`~steersman.policy.reliability.ReliabilityFilter`).  An outage
    of the guard's making (a blip ejecting a model's only decode replica for 30 s) is not the model's: without
    it every disaggregated request failed after its prompt was computed.  Decode replicas have no concurrency
    limit, so out of rotation is the only block."""
    cand = snap.candidates(decode_model(model))
    if snap.blocked_until is not None:
        open_ = cand[snap.blocked_until[cand] <= snap.time]
        if open_.size:
            return open_
    return cand


@DECODE_PICKERS.register("least-loaded")
class LeastLoadedDecode:
    """The available decode replica with the fewest requests in flight (handed to it and not finished), the
    lowest index on ties: a load-based choice, as NVIDIA Dynamo's router makes for the decode stage in
    disaggregated mode (it turns prefix-overlap scoring off there: a decode replica receives the whole KV and
    reuses nothing of its cache)."""

    name = "least-loaded"

    def pick_decode(self, snapshot: FleetSnapshot, request: SchedRequest, prefill: int) -> Route | Reject:
        if decode_model(request.model) not in snapshot.model_masks:
            return Reject(f"no decode replica serves model {request.model!r}", code="no_decode_replica")
        cand = _available(snapshot, request.model)
        if cand.size == 0:
            return Reject(f"no decode replica of model {request.model!r} is available")
        load = snapshot.live[S.IN_FLIGHT, cand]
        j = int(cand[int(np.argmin(load))])  # argmin: the first of the least loaded, i.e. the lowest index
        return Route(j, f"decode: fewest requests in flight ({int(load.min())})")


def make_decode_picker(name: str) -> DecodePicker:
    """The registered decode picker ``name`` (:class:`~steersman.plugins.UnknownPlugin` listing the known ones)."""
    return DECODE_PICKERS.build(name)
