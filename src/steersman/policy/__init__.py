"""Routing policies (pure: snapshot + request -> decision), registered by name."""

from steersman.policy.base import POLICIES, Decision, Reject, RequestView, Route, RoutingPolicy
from steersman.policy.least_outstanding import LeastOutstanding

__all__ = ["POLICIES", "Decision", "LeastOutstanding", "Reject", "RequestView", "Route", "RoutingPolicy", "make_policy"]


def make_policy(name: str) -> RoutingPolicy:
    return POLICIES.get(name)()
