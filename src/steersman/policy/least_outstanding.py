"""Least outstanding requests: the replica with the fewest requests in flight from this gateway.

Ties (an idle fleet) rotate with the request's sequence number, so equal replicas share load evenly.  Engine-reported
waiting requests break ties before rotation, which helps when other gateways
share the fleet.
"""

from __future__ import annotations

from steersman.fleet.snapshot import FleetSnapshot
from steersman.policy.base import POLICIES, Decision, Reject, RequestView, Route

__all__ = ["LeastOutstanding"]


@POLICIES.register("least-outstanding")
class LeastOutstanding:
    name = "least-outstanding"

    def pick(self, snapshot: FleetSnapshot, request: RequestView) -> Decision:
        idx = snapshot.candidates(request.model)
        if idx.size == 0:
            return Reject(f"no healthy replica serves model {request.model!r}", retry_after=1.0)
        load = snapshot.in_flight[idx] + snapshot.waiting[idx] * 1e-3
        ties = idx[load == load.min()]
        return Route(int(ties[request.seq % ties.size]), "least-outstanding")
