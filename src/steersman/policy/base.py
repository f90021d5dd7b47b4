"""The routing-policy extension point: a pure function of (snapshot, request) -> decision."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from steersman.fleet.snapshot import FleetSnapshot
from steersman.plugins import Registry
from steersman.policy.request import SchedRequest

__all__ = ["Route", "Queue", "Reject", "Decision", "RoutingPolicy", "POLICIES", "mix64", "none_in_rotation"]

_M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """SplitMix64 finaliser of ``x`` (mod 2**64): a well-spread bijection of 64-bit words, as an unsigned int,
    deterministic across processes (ties drawn from it spread evenly whatever the request counter's pattern)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@dataclass(frozen=True, slots=True)
class Route:
    """Send the request to ``replica`` now."""

    replica: int
    reason: str = ""
    predicted_ttft_s: float | None = None
    predicted_tpot_s: float | None = None
    tpot_target_s: float = 0.0  # > 0: the TPOT it must keep there (x margin); later arrivals must not break it
    late: bool = False  # no replica was predicted to meet its SLO: an engine with priority scheduling serves it last
    #: the prediction as applied (learnt corrections included), seconds from the decision: its first token and its
    #: end (NaN: the policy does not predict).  A llama.cpp slot frees then (steersman.fleet.slots)
    expected_ttft_s: float = math.nan
    expected_e2e_s: float = math.nan

    @property
    def slo_prediction(self) -> str:
        """What the route predicted of the request's SLO: ``missed`` (no replica was predicted to meet it),
        ``met``, or ``none`` (the policy does not predict, e.g. the baselines)."""
        if self.late:
            return "missed"
        return "none" if self.predicted_ttft_s is None else "met"


@dataclass(frozen=True, slots=True)
class Queue:
    """Hold the request in the gateway until capacity frees ("delay work")."""

    reason: str
    #: it waits for a slot that will hold its prompt (steersman.policy.slot_wait): the gateway made it wait,
    #: so it keeps its place in the queue's order even once its TTFT budget has run out
    keeps_place: bool = False


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse the request: the gateway answers 503 with ``Retry-After`` (no capacity), or, with a 4xx ``status``,
    a client error no replica of this fleet could serve (``param``: the request field it names)."""

    reason: str
    retry_after: float | None = None
    code: str = "no_capacity"  # the OpenAI-format error code
    status: int = 503
    param: str | None = None


Decision = Route | Queue | Reject


def none_in_rotation(model: str) -> Reject:
    """No replica of ``model`` can take a request now: each is unhealthy, loading its weights or drained by an
    operator (it said "no healthy replica" of drained, healthy replicas)."""
    return Reject(f"no replica of model {model!r} is in rotation (unhealthy, loading or drained)")


@runtime_checkable
class RoutingPolicy(Protocol):
    name: str

    def pick(self, snapshot: FleetSnapshot, request: SchedRequest) -> Decision:
        """Choose what to do with ``request``; must not do IO or read the clock."""
        ...


#: Routing policies (named profiles) by name: ``factory(settings) -> RoutingPolicy``.
POLICIES: Registry = Registry("routing policy", RoutingPolicy)
