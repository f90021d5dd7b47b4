"""Retry budget (Envoy), client-side adaptive throttling (Google SRE) and full-jitter backoff.

* :class:`RetryBudget` — concurrent retries may not exceed ``retry_budget_percent``
  of the active requests, but at least ``retry_min_concurrency`` are always allowed
  (Envoy's ``retry_budget``).  A caller may ask for a larger *share* (a protected
  workflow step buys ``workflow_retry_share`` times the budget).
* :class:`AdaptiveThrottle` — over the last ``throttle_window_s`` (30 s) the gateway
  counts upstream *requests* (attempts sent to an engine) and *accepts* (the engine
  served them), counting each when it ends; a new attempt is rejected locally with
  probability ``min(throttle_max_reject, max(0, (requests - K * accepts) / (requests + 1)))``,
  K = ``throttle_k`` (SRE book, "Handling Overload"), once the window holds
  ``throttle_min_requests`` requests (fewer: nothing to judge).  A healthy fleet never
  throttles (accepts == requests); a failing one sheds at the gateway instead of
  hammering the engines.  As Envoy's admission control filter (the SRE throttle in
  Envoy), the attempts it rejects itself are not counted, and it never rejects more
  than 80%: counted, they kept the probability near 1 once the engines served again
  (a 0.2 s burst of failures left a gateway refusing ~90% of requests for over 2.5
  minutes after every engine had recovered: reliability audit, thirty-third session),
  and the 20% let through are what shows the recovery.
* :func:`full_jitter` — AWS "Exponential Backoff and Jitter": sleep a uniform
  random time in ``[0, min(cap, base * 2**attempt))``.

All pure: time and random draws are passed in.
"""

from __future__ import annotations

from steersman.config.reliability import ReliabilitySettings
from steersman.reliability.window import RollingCounts

__all__ = ["RetryBudget", "AdaptiveThrottle", "full_jitter"]


class RetryBudget:
    __slots__ = ("percent", "minimum", "active", "retries")

    def __init__(self, settings: ReliabilitySettings) -> None:
        self.percent = settings.retry_budget_percent
        self.minimum = settings.retry_min_concurrency
        self.active = 0  # client requests in progress
        self.retries = 0  # retries in progress

    def limit(self, share: float = 1.0) -> float:
        return max(float(self.minimum), self.percent / 100.0 * self.active * share)

    def begin(self) -> None:
        self.active += 1

    def end(self) -> None:
        self.active = max(0, self.active - 1)

    def try_retry(self, share: float = 1.0) -> bool:
        """Take a retry token if the budget allows; give it back with :meth:`end_retry`."""
        if self.retries + 1 > self.limit(share):
            return False
        self.retries += 1
        return True

    def end_retry(self) -> None:
        self.retries = max(0, self.retries - 1)


class AdaptiveThrottle:
    _REQ, _ACC = 0, 1
    __slots__ = ("k", "min_requests", "max_reject", "_counts")

    def __init__(self, settings: ReliabilitySettings) -> None:
        self.k = settings.throttle_k
        self.min_requests = settings.throttle_min_requests
        self.max_reject = settings.throttle_max_reject
        self._counts = RollingCounts(settings.throttle_window_s, settings.throttle_buckets)

    def reject_probability(self, now: float) -> float:
        req, acc = self._counts.totals(now)
        if req < self.min_requests:  # too few to judge (see ReliabilitySettings.throttle_min_requests)
            return 0.0
        return min(self.max_reject, max(0.0, (req - self.k * acc) / (req + 1)))

    def admit(self, now: float, u: float) -> bool:
        """May an attempt go upstream?  ``u`` is a uniform draw in [0, 1).  A local rejection is not counted (it says
        nothing of the engines)."""
        return not u < self.reject_probability(now)

    def result(self, now: float, accepted: bool) -> None:
        """An admitted attempt ended: the engine served it (any answer but a server-side failure) or not.

        Counted when it ends, not when sent, so requests still in flight do not
        look rejected (at start-up the first concurrent requests would throttle each other).
        """
        self._counts.add(now, self._REQ)
        if accepted:
            self._counts.add(now, self._ACC)

    def totals(self, now: float) -> tuple[int, int]:
        req, acc = self._counts.totals(now)
        return req, acc


def full_jitter(attempt: int, base_s: float, cap_s: float, u: float) -> float:
    """Backoff before retry number ``attempt`` (0-based); ``u`` uniform in [0, 1)."""
    return u * min(cap_s, base_s * (2.0 ** min(attempt, 30)))
