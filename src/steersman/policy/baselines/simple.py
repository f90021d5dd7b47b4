"""Load-only baselines: round-robin, random, least-request and power-of-two choices.

They are what Kubernetes Services / Envoy / the SGLang router offer without cache
awareness (Envoy's ``ROUND_ROBIN``, ``RANDOM`` and ``LEAST_REQUEST`` load
balancers; SGLang router's ``round_robin``, ``random`` and ``power_of_two``).
Load is this gateway's own requests in flight (``in_flight``).  Nothing is
random at run time: "random" draws come from a hash of the request's sequence
number, so those decisions are pure, reproducible functions of the snapshot and
the request.  Round-robin keeps one counter per model, as a load balancer keeps
one per cluster (its decisions are reproducible from the order of the requests).
"""

from __future__ import annotations

from steersman.config import SchedulerSettings
from steersman.policy.base import POLICIES, Decision, Route
from steersman.policy.baselines.common import at, choose_min, mix64, rule_profile
from steersman.policy.framework import DecisionContext, Profile

__all__ = ["RoundRobin", "round_robin", "random_pick", "least_request", "power_of_two"]


class RoundRobin:
    """The k-th request of a model goes to its candidate ``k mod n``: a counter per model.

    Rotating on the gateway's request counter (``seq``, shared by every model) is not round-robin once models
    interleave: with two models' requests alternating, every request of one model had an even ``seq`` and
    went to the same replica of its two.  Envoy's and the SGLang router's round-robin keep their own index
    per cluster / worker list.  Asking again for the request just placed (same ``seq``: the gateway's warm-up
    decisions, a re-pick) does not advance the rotation."""

    name = "round-robin"

    def __init__(self) -> None:
        self._at: dict[str, tuple[int, int]] = {}  # model -> (seq, k) of its latest request

    def forget_turns(self) -> None:
        self._at.clear()

    def pick(self, ctx: DecisionContext, scores=None) -> Decision:
        cand, req = ctx.candidates, ctx.request
        seq, k = self._at.get(req.model, (-1, -1))
        if req.seq != seq:
            k += 1
            self._at[req.model] = (req.seq, k)
        return Route(int(cand[k % cand.size]), "round-robin")


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
    """Candidate ``k mod n`` for the k-th request of its model (:class:`RoundRobin`)."""
    return rule_profile("round-robin", RoundRobin())


def random_pick(settings: SchedulerSettings) -> Profile:
    return rule_profile("random", _random)


def least_request(settings: SchedulerSettings) -> Profile:
    """Fewest requests in flight from this gateway; ties drawn from a hash of seq."""
    return rule_profile("least-request", _least)


def power_of_two(settings: SchedulerSettings) -> Profile:
    return rule_profile("power-of-two", _p2c)


POLICIES.register("round-robin", round_robin)
POLICIES.register("random", random_pick)
POLICIES.register("least-request", least_request)
POLICIES.register("power-of-two", power_of_two)
