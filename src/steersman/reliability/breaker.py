"""A circuit breaker per replica: closed -> open -> half-open -> closed (Hystrix's rules).

*Closed*: calls flow; outcomes are counted over a rolling window.  Once the window
holds at least ``breaker_min_requests`` calls and at least ``breaker_error_percent``
of them failed, the breaker *opens*: no calls for ``breaker_open_s``.  Then it is
*half-open*: at most ``breaker_half_open_probes`` probe calls at a time; the first
probe that succeeds closes it (with a fresh window), one that fails opens it again.
"""

from __future__ import annotations

import enum

from steersman.config.reliability import ReliabilitySettings
from steersman.reliability.window import RollingCounts

__all__ = ["BreakerState", "CircuitBreaker"]

_OK, _FAIL = 0, 1


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class CircuitBreaker:
    __slots__ = ("s", "_state", "_opened_at", "_probes", "_window", "opens")

    def __init__(self, settings: ReliabilitySettings) -> None:
        self.s = settings
        self._state = BreakerState.CLOSED
        self._opened_at = 0.0
        self._probes = 0  # probe calls in flight while half-open
        self._window = RollingCounts(settings.breaker_window_s, settings.breaker_buckets)
        self.opens = 0  # times it opened (for metrics and tests)

    def state(self, now: float) -> BreakerState:
        if self._state is BreakerState.OPEN and now - self._opened_at >= self.s.breaker_open_s:
            self._state = BreakerState.HALF_OPEN
            self._probes = 0
        return self._state

    def allows(self, now: float) -> bool:
        """May a call go to this replica now?"""
        st = self.state(now)
        if st is BreakerState.CLOSED:
            return True
        return st is BreakerState.HALF_OPEN and self._probes < self.s.breaker_half_open_probes

    def on_call(self, now: float) -> bool:
        """A call is sent; returns True when it is a half-open probe."""
        if self.state(now) is BreakerState.HALF_OPEN:
            self._probes += 1
            return True
        return False

    @property
    def open_until(self) -> float:
        return self._opened_at + self.s.breaker_open_s

    def release_probe(self) -> None:
        """A probe ended without a verdict (its client left): its slot is free again."""
        self._probes = max(0, self._probes - 1)

    def on_result(self, ok: bool, now: float, probe: bool = False) -> None:
        st = self.state(now)
        if st is BreakerState.HALF_OPEN:
            if not probe:
                return  # a call sent before it opened: only probes judge a half-open breaker
            self._probes = max(0, self._probes - 1)
            if ok:
                self._state = BreakerState.CLOSED
                self._window.clear()
            else:
                self._open(now)
            return
        if st is BreakerState.OPEN or probe:
            return  # a call sent before it opened (or a probe of an earlier half-open): already judged
        self._window.add(now, _OK if ok else _FAIL)
        good, bad = self._window.totals(now)
        total = good + bad
        if total >= self.s.breaker_min_requests and bad * 100.0 >= self.s.breaker_error_percent * total:
            self._open(now)

    def failure_share(self, now: float) -> float:
        """Failed share of the results in the window, 0 while it holds fewer than ``breaker_min_requests``."""
        good, bad = self._window.totals(now)
        total = good + bad
        return bad / total if bad and total >= self.s.breaker_min_requests else 0.0

    def _open(self, now: float) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = now
        self._probes = 0
        self.opens += 1
