"""What to do after a failed upstream attempt: the gateway-wide retry state and its one decision.

Shared by the live request path (:class:`steersman.pipeline.runner.Pipeline`, which
sleeps and re-routes) and the digital twin (which schedules the re-route on its
virtual clock), so both retry the same requests, spend the same budget and back
off the same way.  The rules:

* **Continuation** — an attempt that failed after bytes reached the client
  (``Retry.CONTINUE_ONLY``) goes on elsewhere if its stream may be continued and
  its deadline has not passed; no backoff, no budget: it is the same request going
  on, not more load.
* **Retry** — one that failed before (``Retry.SAFE``) is retried while its attempts
  (``retry_max_attempts``), its deadline and the retry budget (Envoy's: retries
  <= 20 % of active requests, min 3; a protected workflow step buys a larger share)
  allow.  A retry away from a replica that its failure took out of rotation (or that
  the gateway abandoned) needs no token: it re-routes that replica's share, it is
  not load on a failing fleet.  A token is held until the retried attempt's first
  token.  The retry waits a full-jitter backoff (AWS) unless that would end past the
  deadline.
* Every attempt first passes the client-side adaptive throttle (Google SRE).

Pure but for its own state: time comes from the injected clock, random draws
from its seeded generator.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from steersman.clock import Clock
from steersman.config import DEFAULTS, ReliabilitySettings
from steersman.obs.histogram import CounterFamily
from steersman.reliability.budget import AdaptiveThrottle, RetryBudget, full_jitter

__all__ = ["Retrier", "AfterFailure"]


@dataclass(frozen=True, slots=True)
class AfterFailure:
    """The decision: ``again`` (route and forward once more, after ``delay_s``) or give up; ``holding``: the
    request holds a retry-budget token from now on; ``outcome``: the counter it was counted under."""

    again: bool
    outcome: str
    delay_s: float = 0.0
    holding: bool = False


class Retrier:
    """The gateway-wide retry state: budget, adaptive throttle, jitter source, counters."""

    def __init__(self, settings: ReliabilitySettings = DEFAULTS.reliability, clock: Clock | None = None,
                 rng: random.Random | None = None) -> None:
        from steersman.clock import WallClock

        self.s = settings
        self.clock = clock or WallClock()
        self.rng = rng or random.Random(0)
        self.budget = RetryBudget(settings)
        self.throttle = AdaptiveThrottle(settings)
        self.requests = 0  # client requests that reached the retry section
        self.attempts = 0  # upstream attempts
        self.counts = CounterFamily("steersman:retries", "Retry decisions of the gateway by outcome.", ["outcome"])
        self.families = [self.counts]  # metric families to register with the gateway's registry

    def share(self, sched) -> float:
        """A protected workflow step (a :class:`~steersman.policy.request.SchedRequest` with value > 0) may use a
        larger share of the budget."""
        return self.s.workflow_retry_share if sched is not None and sched.protection > 0 else 1.0

    def remaining(self, sched) -> float | None:
        """Seconds left to the request's deadline (None: it has none)."""
        deadline = sched.budget.deadline if sched is not None else None
        return None if deadline is None else deadline - self.clock.now()

    # ---- one request ------------------------------------------------------------------------
    def begin(self) -> None:
        self.requests += 1
        self.budget.begin()

    def end(self, holding: bool) -> None:
        if holding:
            self.budget.end_retry()
        self.budget.end()

    def admit_attempt(self, resumed: bool = False) -> bool:
        """May the next upstream attempt go (the adaptive throttle)?  Counts it when it may.  A stream under way
        (``resumed``) goes: its continuation is load already admitted, and refusing it cuts the client's stream."""
        if not resumed and not self.throttle.admit(self.clock.now(), self.rng.random()):
            self.counts.inc("throttled")
            return False
        self.attempts += 1
        return True

    def attempt_ended(self, served: bool) -> None:
        self.throttle.result(self.clock.now(), served)

    def release(self) -> None:
        """The retried attempt got its first token: the retry worked, its token goes back."""
        self.budget.end_retry()

    # ---- the decision -------------------------------------------------------------------------
    def backoff(self, attempt: int, remaining: float | None) -> float | None:
        """Full-jitter delay before attempt number ``attempt + 1``, or None if it would end past the deadline."""
        delay = full_jitter(attempt - 1, self.s.retry_base_backoff_s, self.s.retry_max_backoff_s, self.rng.random())
        return None if remaining is not None and delay >= remaining else delay

    def after_failure(self, continue_only: bool, attempts: int, continuable: bool, remaining: float | None,
                      exempt: Callable[[], bool], evicted: bool, holding: bool, share: float = 1.0) -> AfterFailure:
        """After a failed attempt (the request's ``attempts``-th; ``remaining``: seconds to its deadline or None).

        ``continue_only``: bytes reached the client (``continuable``: its stream may go on elsewhere);
        ``exempt()``: the failed replica is out of rotation now or the attempt was ``evicted`` (the gateway
        abandoned it), asked only when a retry is still possible (reading the fleet's gate may run a sweep);
        ``holding``: the request already holds a retry token; ``share``: of the budget it may use."""
        if continue_only:
            if not continuable or (remaining is not None and remaining <= 0):
                return self._count(AfterFailure(False, "not_continuable", holding=holding))
            return self._count(AfterFailure(True, "continued", holding=holding))
        if attempts >= self.s.retry_max_attempts:
            return self._count(AfterFailure(False, "attempts_exhausted", holding=holding))
        ex = exempt()
        if not holding and not ex:
            if not self.budget.try_retry(share):
                return self._count(AfterFailure(False, "budget_exhausted"))
            holding = True
        delay = self.backoff(attempts, remaining)
        if delay is None:
            return self._count(AfterFailure(False, "deadline", holding=holding))
        return self._count(AfterFailure(True, "evicted" if evicted else "rerouted" if ex else "retried", delay,
                                        holding))

    def _count(self, d: AfterFailure) -> AfterFailure:
        self.counts.inc(d.outcome)
        return d
