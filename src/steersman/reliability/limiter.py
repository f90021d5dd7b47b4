"""Adaptive concurrency per replica: Netflix concurrency-limits' Gradient2 limit.

Each finished request gives a latency sample.  A long-term average of samples
(``limit_long_window`` samples, an exponential average with a warm-up) is the
replica's "no load" latency; the gradient ``tolerance * long / short`` (clamped to
[0.5, 1]) says how much the current latency exceeds it.  The limit moves
towards ``limit * gradient + queue_size`` with ``limit_smoothing``, within
[``limit_min``, ``limit_max``], and does not grow while the replica is
app-limited (fewer than half the limit in flight).  A failed request (5xx,
broken stream, timeout) cuts the limit by ``limit_backoff_ratio`` (AIMD's
backoff), so a replica that starts failing gets less before it is ejected.

The sample for an LLM request is its latency per produced token,
``e2e / (output_tokens + 1)``: a GPU degraded k-fold shows k-fold samples
whatever the request length, while a long answer alone does not look slow.
"""

from __future__ import annotations

from steersman.config.reliability import ReliabilitySettings

__all__ = ["GradientLimiter"]

_WARMUP = 10  # Netflix ExpAvgMeasurement warm-up: a plain mean over the first 10 samples


class GradientLimiter:
    __slots__ = ("s", "limit", "_long", "_n")

    def __init__(self, settings: ReliabilitySettings) -> None:
        self.s = settings
        self.limit = float(settings.limit_initial)
        self._long = 0.0
        self._n = 0

    @property
    def long_rtt(self) -> float:
        return self._long

    def _add_long(self, rtt: float) -> float:
        self._n += 1
        if self._n <= _WARMUP:
            self._long += (rtt - self._long) / self._n
        else:
            a = 2.0 / (self.s.limit_long_window + 1)
            self._long += a * (rtt - self._long)
        return self._long

    def on_sample(self, rtt: float, in_flight: float) -> float:
        """A finished request's latency sample with ``in_flight`` requests outstanding; returns the new limit."""
        if not rtt > 0:
            return self.limit
        s = self.s
        long = self._add_long(rtt)
        if long / rtt > 2.0:  # latency fell a lot: let the baseline follow down faster
            self._long = long * 0.95
        if in_flight < self.limit / 2:
            return self.limit  # app-limited: no evidence to move on
        gradient = max(0.5, min(1.0, s.limit_rtt_tolerance * long / rtt))
        new = self.limit * gradient + s.limit_queue_size
        new = self.limit * (1 - s.limit_smoothing) + new * s.limit_smoothing
        self.limit = max(s.limit_min, min(s.limit_max, new))
        return self.limit

    def on_failure(self) -> float:
        self.limit = max(self.s.limit_min, self.limit * self.s.limit_backoff_ratio)
        return self.limit

    def allows(self, in_flight: float) -> bool:
        return in_flight < int(self.limit)
