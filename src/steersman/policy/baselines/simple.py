"""Load-only baselines: round-robin, random, least-request and power-of-two choices.

They are what Kubernetes Services / Envoy / the SGLang router offer without cache
awareness (Envoy's ``ROUND_ROBIN``, ``RANDOM`` and ``LEAST_REQUEST`` load
balancers; SGLang router's ``round_robin``, ``random`` and ``power_of_two``).
Load is this gateway's own requests in flight (``in_flight``).  Nothing is
random at run time: "random" draws come from a hash of the request's sequence
number, so every decision is a pure, reproducible function of the snapshot and
the request.
"""

from __future__ import annotations

from steersman.config import SchedulerSettings
from steersman.policy.base import POLICIES, Decision, Route
from steersman.policy.baselines.common import at, choose_min, mix64, rule_profile
from steersman.policy.framework import DecisionContext, Profile

__all__ = ["round_robin", "random_pick", "least_request", "power_of_two"]


def _rr(ctx: DecisionContext) -> Decision:
    cand = ctx.candidates
    return Route(int(cand[ctx.request.seq % cand.size]), "round-robin")


def _random(ctx: DecisionContext) -> Decision:
    cand = ctx.candidates
    return Route(int(cand[mix64(ctx.request.seq) % cand.size]), "random (seeded by seq)")


def _least(ctx: DecisionContext) -> Decision:
    return choose_min(ctx, at(ctx, ctx.snapshot.in_flight), "least requests in flight")


def _p2c(ctx: DecisionContext) -> Decision:
    """Mitzenmacher's power of two choices: two distinct candidates drawn from a hash of seq, the one
    with fewer requests in flight wins (the first drawn on a tie)."""
    cand = ctx.candidates
    n = cand.size
    if n == 1:
        return Route(int(cand[0]), "power-of-two (single candidate)")
    h = mix64(ctx.request.seq)
    a = h % n
    b = (a + 1 + (h >> 32) % (n - 1)) % n
    load = ctx.snapshot.in_flight
    i = cand[b] if load[cand[b]] < load[cand[a]] else cand[a]
    return Route(int(i), "power-of-two choices")


def round_robin(settings: SchedulerSettings) -> Profile:
    """Candidate ``seq mod n``: the gateway's request counter makes the rotation stateless."""
    return rule_profile("round-robin", _rr)


def random_pick(settings: SchedulerSettings) -> Profile:
    return rule_profile("random", _random)


def least_request(settings: SchedulerSettings) -> Profile:
    """Fewest requests in flight from this gateway; ties rotate with seq."""
    return rule_profile("least-request", _least)


def power_of_two(settings: SchedulerSettings) -> Profile:
    return rule_profile("power-of-two", _p2c)


POLICIES.register("round-robin", round_robin)
POLICIES.register("random", random_pick)
POLICIES.register("least-request", least_request)
POLICIES.register("power-of-two", power_of_two)
