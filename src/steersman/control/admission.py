"""Admission: may this tenant's request enter now?  And can its deadline still be met?

:class:`DefaultAdmitter` checks, in order: the tenant's dollar budget
(:class:`OverBudget`), then its request and token buckets, all or nothing
(:class:`TooLarge` if the request alone exceeds the token bucket,
:class:`Throttle` with ``retry_after`` otherwise), then its requests in flight
(:class:`TooManyInFlight`, past ``max_concurrent_requests``: last, so that a
refusal retrying cannot help is not hidden behind one that can).  An :class:`Admit` holds the
reservation; the gateway must end every admitted request exactly once with
:meth:`~DefaultAdmitter.settle` (it ran: real tokens and cost) or
:meth:`~DefaultAdmitter.release` (it never ran: shed, expired, cancelled while
queued).

:func:`check_deadline` refuses early a request whose absolute deadline cannot be
met given the scheduler's best predicted completion time (:class:`Infeasible`,
503 with ``Retry-After``).

Each refusal has ``status`` (HTTP) and ``code`` (OpenAI error code), a human
``reason`` and ``retry_after`` (seconds, or ``None`` when retrying cannot help):
class attributes where a type has one answer, fields where it has several
(:class:`OverBudget`: spent, or held by requests in flight; :class:`Infeasible`).  Pure: ``now`` comes from the caller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from steersman.config.admission import AdmissionSettings
from steersman.control.budget import BudgetLedger, OverBudget
from steersman.control.ratelimit import RateLimiter, Reservation, Throttle, TooLarge
from steersman.control.tenants import TenantConfig
from steersman.plugins import Registry
from steersman.policy.request import SchedRequest

__all__ = [
    "ADMITTERS", "Admit", "Infeasible", "AdmissionDecision", "Refusal", "Admitter", "DefaultAdmitter", "check_deadline",
    "make_admitter",
    "Throttle", "TooLarge", "OverBudget", "TooManyInFlight",
]


@dataclass(frozen=True, slots=True)
class Admit:
    """Admitted: ``reservation`` must be settled or released exactly once."""

    tenant: TenantConfig
    reservation: Reservation
    #: the model it runs on, and the dollars its budget holds for it until it ends (:class:`BudgetLedger`)
    model: str = ""
    held_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class Infeasible:
    """The deadline cannot be met: 503 with ``retry_after`` when the load ahead is why, or when no completion time
    can be predicted; 400 (``retry_after`` None) when no retry with the same window can succeed: the request
    alone needs longer than its window even on an idle fleet, or the window passed before it could be scheduled.
    That is the client's to change (a longer deadline, a shorter answer): a 503 its client would retry (the
    OpenAI SDKs retry every 5xx) was refused again at once, every time."""

    reason: str
    retry_after: float | None
    status: int = 503
    code: ClassVar[str] = "deadline_infeasible"


@dataclass(frozen=True, slots=True)
class TooManyInFlight:
    """The tenant has ``max_concurrent_requests`` in the gateway already (queued or running): 429 until one ends;
    ``Retry-After`` 1 s, as the budget's 429 for dollars held by requests in flight (when one ends is not known)."""

    reason: str
    limit: int
    retry_after: ClassVar[float] = 1.0
    status: ClassVar[int] = 429
    code: ClassVar[str] = "concurrency_limit_exceeded"


Refusal = Throttle | TooLarge | OverBudget | TooManyInFlight
AdmissionDecision = Admit | Throttle | TooLarge | OverBudget | TooManyInFlight


@runtime_checkable
class Admitter(Protocol):
    """Decides whether a request may enter; no IO, no clock reads.  ``admit`` returns an :class:`Admit` (which
    :meth:`settle` or :meth:`release` later receives, exactly once) or a refusal: any object with ``status``,
    ``code``, ``reason`` and ``retry_after`` (seconds, or None when retrying cannot help), answered in the OpenAI
    error format.  Registered by name in :data:`ADMITTERS`; ``admission.admitter`` picks one."""

    def admit(self, req: SchedRequest, tenant: TenantConfig, now: float) -> AdmissionDecision: ...

    def settle(self, ticket: Admit, *, used_tokens: int, cost_usd: float, now: float) -> None: ...

    def release(self, ticket: Admit, now: float) -> None: ...


class DefaultAdmitter:
    """The tenant's requests in flight, its budget, then its request and token buckets."""

    def __init__(
        self,
        settings: AdmissionSettings = AdmissionSettings(),
        limiter: RateLimiter | None = None,
        ledger: BudgetLedger | None = None,
    ) -> None:
        self.limiter = limiter if limiter is not None else RateLimiter(settings)
        self.ledger = ledger if ledger is not None else BudgetLedger()
        #: per tenant with ``max_concurrent_requests``, its requests admitted and not yet settled or released
        self.in_flight: dict[str, int] = {}

    def admit(self, req: SchedRequest, tenant: TenantConfig, now: float) -> AdmissionDecision:
        if req.tenant != tenant.name:
            raise ValueError(f"request of tenant {req.tenant!r} admitted as tenant {tenant.name!r}")
        over = self.ledger.check(tenant)
        if over is not None:
            return over
        tokens = req.limit_tokens  # the prompt and every sample's max_tokens (settled with what it used)
        got = self.limiter.reserve(tenant, tokens, now)
        if not isinstance(got, Reservation):
            return got
        most = tenant.max_concurrent_requests
        if most is not None and self.in_flight.get(tenant.name, 0) >= most:
            self.limiter.release(got, now)  # (nothing else was taken yet)
            return TooManyInFlight(f"tenant {tenant.name!r} has {most} requests in flight, its max_concurrent_requests",
                                   most)
        usd = self.ledger.estimate(req.model, tokens) if tenant.budget_usd is not None else 0.0
        self.ledger.hold(tenant.name, usd)
        if most is not None:
            self.in_flight[tenant.name] = self.in_flight.get(tenant.name, 0) + 1
        return Admit(tenant, got, req.model, usd)

    def _ended(self, ticket: Admit) -> None:
        if ticket.tenant.max_concurrent_requests is None:
            return  # admitted uncapped, so never counted (the cap may have been set since: POST /admin/reload)
        name = ticket.tenant.name
        n = self.in_flight.get(name)
        if n is not None:
            if n <= 1:
                del self.in_flight[name]  # (a tenant seen once holds no entry)
            else:
                self.in_flight[name] = n - 1

    def settle(self, ticket: Admit, *, used_tokens: int, cost_usd: float, now: float) -> None:
        """The request ran: refund or charge the token difference, add its cost to the budget."""
        self.limiter.settle(ticket.reservation, used_tokens, now)  # (raises if it ended already: before the count)
        self._ended(ticket)
        self.ledger.unhold(ticket.tenant.name, ticket.held_usd)
        self.ledger.charge(ticket.tenant.name, cost_usd, ticket.model or None, used_tokens)

    def release(self, ticket: Admit, now: float) -> None:
        """The request never ran: give back its request slot, tokens and the budget it held."""
        self.limiter.release(ticket.reservation, now)
        self._ended(ticket)
        self.ledger.unhold(ticket.tenant.name, ticket.held_usd)


#: admitters by name: a factory taking the :class:`AdmissionSettings` (``admission.admitter`` names one)
ADMITTERS: Registry = Registry("admitter", Admitter)
ADMITTERS.register("default", DefaultAdmitter)


def make_admitter(settings: AdmissionSettings) -> Admitter:
    """The admitter ``settings.admitter`` names, made with ``settings`` and checked against :class:`Admitter`."""
    return ADMITTERS.build(settings.admitter, settings)


def check_deadline(deadline: float | None, predicted_finish: float, now: float, *, min_service_s: float | None = None) -> Infeasible | None:
    """``None`` if ``deadline`` (absolute, ``LatencyBudget.deadline``) can be met, else why not.

    ``predicted_finish`` is the scheduler's best predicted completion time
    (absolute); ``min_service_s``, if known, the request's own run time on an
    idle replica.  ``retry_after = predicted_finish - deadline``: a client that
    retries that much later with the same relative window gets a deadline that
    much later, while the work ahead of it has drained by at least as much if
    nothing new arrives.  It is ``None`` when retrying cannot help: the deadline
    has passed, or the request alone needs longer than its window.
    """
    if deadline is None:
        return None
    for name, v in (("deadline", deadline), ("predicted_finish", predicted_finish), ("now", now)):
        if math.isnan(v):
            raise ValueError(f"{name} must be a number, got NaN")
    if deadline <= now:  # before it could even be scheduled: as hopeless as a request too long for its window
        return Infeasible(f"the deadline passed {now - deadline:.3f} s ago, before the request could be scheduled: "
                          "allow more time", None, 400)
    if predicted_finish <= deadline:
        return None
    window = deadline - now
    if min_service_s is not None and min_service_s > window:
        return Infeasible(f"the request alone is predicted to take {min_service_s:.3f} s (on an idle replica), "
                          f"longer than its deadline allows ({window:.3f} s away): allow more time or ask for a "
                          "shorter answer", None, 400)
    if math.isinf(predicted_finish):
        return Infeasible(f"no completion time can be predicted within its deadline ({window:.3f} s away)", None)
    late = predicted_finish - deadline
    return Infeasible(f"predicted to finish {late:.3f} s after its deadline ({window:.3f} s away)", late)
