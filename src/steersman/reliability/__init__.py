"""Reliability mechanisms, pure and clock-free (time is passed in), shared by the gateway and the twin.

* :class:`OutlierDetector` — consecutive failures, latency outliers, timed ejection with a fleet cap.
* :class:`CircuitBreaker` — closed / open / half-open with bounded probes.
* :class:`RetryBudget`, :class:`AdaptiveThrottle`, :func:`full_jitter` — retries that never multiply load.
* :class:`GradientLimiter` — adaptive concurrency per replica (Gradient2).
* :class:`ReplicaGuard` — the three per-replica mechanisms over a fleet, as the view policies read.
* :func:`brownout` — sheddable traffic to a cheaper model, or refused, when the fleet is saturated.
"""

from steersman.reliability.breaker import BreakerState, CircuitBreaker
from steersman.reliability.brownout import Keep, MoveTo, Shed, brownout
from steersman.reliability.budget import AdaptiveThrottle, RetryBudget, full_jitter
from steersman.reliability.ejection import OutlierDetector
from steersman.reliability.guard import ReplicaGuard
from steersman.reliability.limiter import GradientLimiter

__all__ = [
    "AdaptiveThrottle", "BreakerState", "CircuitBreaker", "GradientLimiter", "Keep", "MoveTo", "OutlierDetector",
    "ReplicaGuard", "RetryBudget", "Shed", "brownout", "full_jitter",
]
