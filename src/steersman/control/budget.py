"""Per-tenant spend in US dollars against the tenant's ``budget_usd``.

A tenant whose recorded spend is at or over its budget is refused
(:class:`OverBudget`: 429 with code ``insufficient_quota``, as OpenAI answers an
exhausted quota; no ``Retry-After``, a budget does not refill by itself).
Spend is charged when a request ends, with its real cost, so a tenant just
under its budget can overshoot it by the cost of the requests it has in flight.
The ledger lives in memory: it starts at zero with the process (persisting or
resetting it per billing period is the caller's job, see :meth:`reset`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from steersman.control.tenants import TenantConfig

__all__ = ["BudgetLedger", "OverBudget"]


@dataclass(frozen=True, slots=True)
class OverBudget:
    """The tenant has spent its budget: refuse until the budget is raised or the ledger reset."""

    reason: str
    spent_usd: float
    budget_usd: float
    retry_after: ClassVar[None] = None
    status: ClassVar[int] = 429
    code: ClassVar[str] = "insufficient_quota"


class BudgetLedger:
    """Dollars spent per tenant name."""

    __slots__ = ("_spent",)

    def __init__(self) -> None:
        self._spent: dict[str, float] = {}

    def check(self, tenant: TenantConfig) -> OverBudget | None:
        """``None`` if the tenant may spend more, else why not."""
        if tenant.budget_usd is None:
            return None
        spent = self._spent.get(tenant.name, 0.0)
        if spent >= tenant.budget_usd:
            return OverBudget(
                f"tenant {tenant.name!r} has spent ${spent:.4f} of its ${tenant.budget_usd:g} budget",
                spent, tenant.budget_usd,
            )
        return None

    def charge(self, tenant: str, usd: float) -> None:
        """Record ``usd`` (finite, >= 0) spent by ``tenant``."""
        if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not math.isfinite(usd) or usd < 0:
            raise ValueError(f"cost must be a finite number of dollars >= 0, got {usd!r}")
        if usd:
            self._spent[tenant] = self._spent.get(tenant, 0.0) + float(usd)

    def spent(self, tenant: str) -> float:
        return self._spent.get(tenant, 0.0)

    def reset(self, tenant: str | None = None) -> None:
        """Forget the spend of one tenant (or of all): a new billing period."""
        if tenant is None:
            self._spent.clear()
        else:
            self._spent.pop(tenant, None)
