"""Per-replica reliability state of a fleet: outlier ejection, circuit breakers, concurrency limits.

The fleet's IO edge feeds it what happens to each request (dispatched, first
token, finished, failed) and to each health check; it does not track which
requests still await a first token: the fleet does (its ``stalled_since`` row,
which the policies read too), and hands that row to every sweep, where a replica
stalled far longer than its peers' TTFT is ejected.  Policies see only its
read-only view in the fleet snapshot: ``blocked_until`` (a replica is out of
rotation until then: ejected, or its breaker open / out of half-open probes)
and ``limits`` (adaptive concurrency); the fleet also keeps each replica's
:meth:`failure_share` in the snapshot's ``fail_share`` row, which the picker prices.  The ``reliability`` filter of every
scheduling profile applies them (see :mod:`steersman.policy.reliability`).

Requests are identified by an opaque ``key`` (the fleet's ticket); pure: the
caller passes ``now``.
"""

from __future__ import annotations

import numpy as np

from steersman.config.reliability import ReliabilitySettings
from steersman.reliability.breaker import BreakerState, CircuitBreaker
from steersman.reliability.ejection import OutlierDetector
from steersman.reliability.limiter import GradientLimiter

__all__ = ["ReplicaGuard"]


class ReplicaGuard:
    def __init__(self, n: int, settings: ReliabilitySettings, alpha: float) -> None:
        self.s = settings
        self.n = n
        self.outliers = OutlierDetector(n, settings, alpha)
        self.breakers = [CircuitBreaker(settings) for _ in range(n)]
        self.limiters = [GradientLimiter(settings) for _ in range(n)]
        self.limits = np.array([lim.limit for lim in self.limiters])
        self._probation = np.zeros(n, dtype=bool)  # back from an ejection, not yet shown progress
        self._down_since = np.full(n, np.nan)  # since when its active health checks fail (NaN: they pass)
        self._breaker_until = np.full(n, -np.inf)
        self._blocked: np.ndarray | None = None  # blocked_until's answer, kept while its inputs are unchanged
        self._blocked_key = -1  # the outliers' ``changes`` it was computed at
        self._probes: dict[int, int] = {}  # key -> replica, for half-open probes in flight
        self._swept = -np.inf
        self.on_eject = None  # optional callback(replica, reason) at the IO edge (logging, metrics)
        self.on_sweep = None  # optional callback(now) at each sweep (the IO edge checks its streams' progress)

    # ---- the view policies read ------------------------------------------------------------
    def blocked_until(self, now: float, stalled_since: np.ndarray) -> np.ndarray:
        """Until when each replica is out of rotation (read-only; every fleet snapshot reads it).
        ``stalled_since``: the fleet's row, for the sweep this may run (see :meth:`sweep`)."""
        self.maybe_sweep(now, stalled_since)
        b = self._blocked
        if b is None or self._blocked_key != self.outliers.changes:
            b = self._blocked = np.maximum(self.outliers.until, self._breaker_until)
            b.flags.writeable = False  # lent to snapshots: a change makes a new array, never writes this one
            self._blocked_key = self.outliers.changes
        return b

    def maybe_sweep(self, now: float, stalled_since: np.ndarray) -> None:
        """Judge latency outliers if ``outlier_sweep_s`` passed (called per snapshot and per scrape)."""
        if now - self._swept >= self.s.outlier_sweep_s:
            self.sweep(now, stalled_since)

    def sweep(self, now: float, stalled_since: np.ndarray) -> None:
        """Judge latency outliers now.  ``stalled_since``: per replica, since when it has held requests
        awaiting a first token without progress, NaN when none awaits (the fleet's current row: read
        during the call, never kept)."""
        self._swept = now
        for i in self.outliers.sweep(now, stalled_since):
            self._ejected(i)
        if self.on_sweep is not None:
            self.on_sweep(now)

    def _ejected(self, i: int) -> None:
        # when the ejection ends it takes probation_limit requests until one shows progress (a first
        # token or a whole answer): a replica still hung then holds one request, not a burst
        self._probation[i] = True
        self.limits[i] = min(self.limits[i], self.s.probation_limit)
        if self.on_eject is not None:
            self.on_eject(i, self.outliers.reasons[i])

    def _sync_breaker(self, i: int, now: float) -> None:
        b = self.breakers[i]
        st = b.state(now)
        if st is BreakerState.CLOSED:
            until = -np.inf
        elif st is BreakerState.OPEN:
            until = b.open_until
        else:  # half-open: open to probes until they are all out
            until = -np.inf if b.allows(now) else np.inf
        if self._breaker_until[i] != until:
            self._breaker_until[i] = until
            self._blocked = None

    def failure_share(self, i: int, now: float) -> float:
        """Replica ``i``'s recent server-side failure share (the breaker's window; 0 below its minimum volume, or
        with ``failure_routing`` off): the fleet keeps it in its ``fail_share`` row for the picker."""
        return self.breakers[i].failure_share(now) if self.s.failure_routing else 0.0

    # ---- request events ---------------------------------------------------------------------
    def dispatched(self, i: int, key: int, now: float) -> None:
        if self.breakers[i].on_call(now):
            self._probes[key] = i
        self._sync_breaker(i, now)

    def first_token(self, i: int, ttft: float) -> None:
        self.outliers.latency(i, ttft=ttft)
        self._progressed(i)

    def _progressed(self, i: int) -> None:
        """Replica ``i`` showed progress: a replica back from an ejection leaves probation (its own limit again)."""
        if self._probation[i]:
            self._probation[i] = False
            self.limits[i] = self.limiters[i].limit

    def _limit(self, i: int, limit: float) -> float:
        return min(limit, self.s.probation_limit) if self._probation[i] else limit

    def succeeded(self, i: int, key: int, now: float, e2e: float, output_tokens: int, in_flight: float,
                  tpot: float | None = None) -> None:
        """The replica served the request (its answer reached the end; 4xx answers count: not its fault)."""
        self.outliers.success(i)
        if tpot is not None:
            self.outliers.latency(i, tpot=tpot)
        self.breakers[i].on_result(True, now, self._probes.pop(key, None) is not None)
        self._sync_breaker(i, now)
        self._probation[i] = False  # it answered: progress
        self.limits[i] = self.limiters[i].on_sample(e2e / (output_tokens + 1), in_flight)

    def failed(self, i: int, key: int, now: float) -> None:
        """A server-side failure of the replica (5xx, connect failure, broken or stalled stream)."""
        if self.outliers.failure(i, now):
            self._ejected(i)
        self.breakers[i].on_result(False, now, self._probes.pop(key, None) is not None)
        self._sync_breaker(i, now)
        self.limits[i] = self._limit(i, self.limiters[i].on_failure())

    def released(self, i: int, key: int, now: float) -> None:
        """The request ended without a verdict on the replica (the client left, a deadline passed)."""
        if self._probes.pop(key, None) is not None:
            self.breakers[i].release_probe()
            self._sync_breaker(i, now)

    def health(self, i: int, ok: bool, now: float, active: bool = True) -> None:
        """An active health check's result (the metrics scraper).  A replica whose checks failed and now pass
        (its engine died, or restarted, and serves again: a restart) leaves an ejection at once, whatever
        ``uneject_on_active_health`` says: the failures that ejected it were the dead process's, and a hung engine,
        which that setting guards against, still answers its checks, so it never passes this way; checks down for
        less than ``reliability.restart_down_s`` are a blip, not a restart (no flapping ejection).  Before, a
        replica restored after a kill waited out the rest of its 30 s ejection idle (a twin drill audit: a
        restore at 15 s took traffic at 35 s, weights warm at 23 s).  Passive detection (``active`` False: a failed
        connection) does not count as a failed check: a replica refusing some connections while its checks pass
        would leave every ejection at the next check."""
        if not active:
            return
        since = self._down_since[i]
        if not ok:
            if since != since:  # NaN: the first failed check of a streak
                self._down_since[i] = now
            return
        self._down_since[i] = np.nan
        if (since == since and now - since >= self.s.restart_down_s) or self.s.uneject_on_active_health:
            self.outliers.uneject(i, now)  # (a blip of a few failed checks is no restart: reliability.restart_down_s)

    def probe_timed_out(self, i: int, now: float, reason: str) -> bool:
        """An idle probe got no answer in time and the replica showed no work meanwhile (a hang, see
        :mod:`steersman.reliability.idle_probe`): eject it (within ``max_ejection_percent``); True if it was."""
        if self.outliers.is_ejected(i, now) or not self.outliers.eject(i, now, reason):
            return False
        self._ejected(i)
        return True

    def probe_ejected(self, now: float) -> np.ndarray:
        """Per replica, whether an idle probe should ask it although it is ejected: while the ejection cap
        (``max_ejection_percent``) has refused another replica's ejection within the last sweep interval x 10, an
        ejected replica that serves again is holding the place a hung one needs (its waiting requests stay stuck
        there for the rest of the other's ejection: 29 s instead of 2.4 s in a reliability audit)."""
        o = self.outliers
        if not self._cap_pressed(now):
            return np.zeros(o.n, dtype=bool)
        return o.until > now

    def _cap_pressed(self, now: float) -> bool:
        """The ejection cap refused an ejection within the last 10 sweep intervals (each sweep that finds the hung
        replica still stalled refuses it again, so the pressure lasts while it does)."""
        return now - self.outliers.capped_at <= 10 * self.s.outlier_sweep_s

    def probe_answered(self, i: int, now: float | None = None) -> bool:
        """An idle probe was answered: progress, as a whole answer is (a replica back from an ejection leaves
        probation), and a success (a failed probe counts among the consecutive failures: a replica answering 3
        probes in 4 was ejected for "5 consecutive failures" after 20).  An ejected replica asked because the cap
        held back another ejection (:meth:`probe_ejected`) comes back at once (Envoy's
        successful_active_health_check_uneject_host: an inference probe answered, not a scrape, shows it serves).
        True if it came back."""
        o = self.outliers
        back = now is not None and o.until[i] > now and self._cap_pressed(now)
        if back:
            o.uneject(i, now)
        self.outliers.success(i)
        self._progressed(i)
        return back

    # ---- introspection -----------------------------------------------------------------------
    def state(self, i: int, now: float) -> dict:
        o = self.outliers
        return {
            "ejected": o.is_ejected(i, now), "ejections": int(o.total[i]), "reason": o.reasons[i],
            "breaker": self.breakers[i].state(now).value, "breaker_opens": self.breakers[i].opens,
            "limit": float(self.limits[i]), "probation": bool(self._probation[i]),
            "failure_share": self.failure_share(i, now),
        }
