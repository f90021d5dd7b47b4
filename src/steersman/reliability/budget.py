"""Retry budget (Envoy), client-side adaptive throttling (Google SRE) and full-jitter backoff.

* :class:`RetryBudget` — concurrent retries may not exceed ``retry_budget_percent``
  of the active requests, but at least ``retry_min_concurrency`` are always allowed
  (Envoy's ``retry_budget``).  A caller may ask for a larger *share* (a protected
  workflow step buys ``workflow_retry_share`` times the budget).
* :class:`AdaptiveThrottle` — over the last ``throttle_window_s`` the gateway
  counts upstream *requests* (attempts, including ones it rejected itself) and
  *accepts* (the engine served them); a new attempt is rejected locally with
  probability ``max(0, (requests - K * accepts) / (requests + 1))``, K =
  ``throttle_k`` (SRE book, "Handling Overload").  A healthy fleet never
  throttles (accepts == requests); a failing one sheds at the gateway instead of
  hammering the engines.
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
    __slots__ = ("k", "_counts")

    def __init__(self, settings: ReliabilitySettings) -> None:
        self.k = settings.throttle_k
        self._counts = RollingCounts(settings.throttle_window_s, settings.throttle_buckets)

    def reject_probability(self, now: float) -> float:
        req, acc = self._counts.totals(now)
        return max(0.0, (req - self.k * acc) / (req + 1))

    def admit(self, now: float, u: float) -> bool:
        """Count an attempt; ``u`` is a uniform draw in [0, 1).  False: reject it locally."""
        p = self.reject_probability(now)
        self._counts.add(now, self._REQ)
        return not u < p

    def accepted(self, now: float) -> None:
        """The engine served an attempt (any answer that was not a server-side failure)."""
        self._counts.add(now, self._ACC)

    def totals(self, now: float) -> tuple[int, int]:
        req, acc = self._counts.totals(now)
        return req, acc


def full_jitter(attempt: int, base_s: float, cap_s: float, u: float) -> float:
    """Backoff before retry number ``attempt`` (0-based); ``u`` uniform in [0, 1)."""
    return u * min(cap_s, base_s * (2.0 ** min(attempt, 30)))
