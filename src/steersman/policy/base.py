"""The routing-policy extension point: a pure function of (snapshot, request) -> decision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from steersman.fleet.snapshot import FleetSnapshot
from steersman.plugins import Registry

__all__ = ["RequestView", "Route", "Reject", "Decision", "RoutingPolicy", "POLICIES"]


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a policy may know about a request."""

    model: str
    kind: str  # "chat" | "completion"
    stream: bool
    max_tokens: int | None = None
    priority: int = 0
    seq: int = 0  # the gateway's request counter: a deterministic tie-breaker


@dataclass(frozen=True, slots=True)
class Route:
    replica: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Reject:
    reason: str
    retry_after: float | None = None


Decision = Route | Reject


@runtime_checkable
class RoutingPolicy(Protocol):
    name: str

    def pick(self, snapshot: FleetSnapshot, request: RequestView) -> Decision:
        """Choose a replica for ``request``; must not do IO or read the clock."""
        ...


#: Routing policies by name (``policy:`` in the fleet file).
POLICIES: Registry = Registry("routing policy")
