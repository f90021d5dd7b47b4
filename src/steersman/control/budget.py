"""Per-tenant spend in US dollars against the tenant's ``budget_usd``.

A tenant whose recorded spend is at or over its budget is refused (:class:`OverBudget`:
429 with code ``insufficient_quota``, as OpenAI answers an exhausted quota; no
``Retry-After``, a budget does not refill by itself); one whose spend, with what its
requests in flight are expected to cost, is at or over it is refused too, with a
retryable 429 ``rate_limit_exceeded`` (``Retry-After`` 1 s: the holds clear as they end).  Spend is charged when a
request ends, with its real cost; until then the request holds an *estimate*
(:meth:`BudgetLedger.hold`: its reserved tokens at the dollars per token its model's
requests have cost so far), so a burst of concurrent requests stops once their
estimates reach what is left of the budget: without it a tenant just under its
budget overshot it by whatever it had in flight (a state audit: 30 concurrent
requests admitted after the budget was spent, 35x over).  The overshoot left is
the misestimates of the requests in flight (a request costs more in a batch than
alone: up to ~2x measured live), and, before any request of its model has ended,
their whole cost (nothing is known of their price yet).  The ledger lives in
memory: it starts at zero with the process, unless ``gateway.limits_url`` shares it
through Redis (:mod:`steersman.state.shared_limits`: spend kept across restarts; a
reset there is deleting the tenant key's ``usd`` field, :meth:`reset` alone is undone
by the next sync).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from steersman.control.tenants import TenantConfig

__all__ = ["BudgetLedger", "OverBudget"]

#: how fast the dollars-per-token estimate of a model comes down (the scheduler's latency EWMA weight); it goes up
#: at once (a request's cost per token grows with the batch it shares its engine with)
_PRICE_ALPHA = 0.2


@dataclass(frozen=True, slots=True)
class OverBudget:
    """The tenant has spent its budget: refuse until the budget is raised or the ledger reset (``insufficient_quota``,
    no ``Retry-After``).  Or, its spend under the budget, its requests in flight are expected to spend the rest:
    ``rate_limit_exceeded`` with ``Retry-After`` 1 s (it clears as they end, on less than expected, or it does not)."""

    reason: str
    spent_usd: float
    budget_usd: float
    retry_after: float | None = None
    code: str = "insufficient_quota"
    status: ClassVar[int] = 429


def _usd(x: float) -> str:
    """Dollars as a budget message shows them: cents above $1, else 4 significant digits (a $2e-05 budget's spend
    read "$0.0000 of its $2e-05")."""
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:.4g}"


class BudgetLedger:
    """Dollars spent per tenant name, and held by the requests in flight."""

    __slots__ = ("_spent", "_held", "_price", "_others", "_unsynced")

    def __init__(self) -> None:
        self._spent: dict[str, float] = {}
        self._held: dict[str, float] = {}
        self._price: dict[str, float] = {}  # model -> dollars per token of its ended requests (EWMA)
        self._others: dict[str, float] = {}  # tenant -> dollars other gateways' requests in flight hold (shared)
        self._unsynced: dict[str, float] | None = None  # spend not yet handed to the other gateways (None: not shared)

    def check(self, tenant: TenantConfig) -> OverBudget | None:
        """``None`` if the tenant may spend more (its spend and its requests in flight's estimates are under its
        budget), else why not."""
        if tenant.budget_usd is None:
            return None
        spent = self._spent.get(tenant.name, 0.0)
        held = self._held.get(tenant.name, 0.0) + self._others.get(tenant.name, 0.0)
        if spent >= tenant.budget_usd:
            return OverBudget(f"tenant {tenant.name!r} has spent {_usd(spent)} of its {_usd(tenant.budget_usd)} budget",
                              spent, tenant.budget_usd)
        if spent + held >= tenant.budget_usd:  # not spent yet: retry once its requests in flight end
            return OverBudget(f"tenant {tenant.name!r} has spent {_usd(spent)} of its {_usd(tenant.budget_usd)} budget "
                              f"and its requests in flight are expected to cost {_usd(held)} more; retry once they "
                              "end", spent, tenant.budget_usd, 1.0, "rate_limit_exceeded")
        return None

    def estimate(self, model: str, tokens: int) -> float:
        """Dollars ``tokens`` of ``model`` are expected to cost: at its requests' price so far, else the dearest
        model's, else 0 (nothing has ended yet)."""
        price = self._price.get(model)
        if price is None:
            price = max(self._price.values(), default=0.0)
        return tokens * price

    def hold(self, tenant: str, usd: float) -> None:
        """A request of ``tenant`` expected to cost ``usd`` starts: count it until :meth:`unhold`."""
        if usd > 0:
            self._held[tenant] = self._held.get(tenant, 0.0) + usd

    def unhold(self, tenant: str, usd: float) -> None:
        """The request that held ``usd`` ended (then :meth:`charge` its real cost) or never ran."""
        if usd > 0:
            left = self._held.get(tenant, 0.0) - usd
            if left > 1e-12:
                self._held[tenant] = left
            else:
                self._held.pop(tenant, None)

    def charge(self, tenant: str, usd: float, model: str | None = None, tokens: int = 0) -> None:
        """Record ``usd`` (finite, >= 0) spent by ``tenant``; with ``model`` and the ``tokens`` it used, learn that
        model's price per token."""
        if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not math.isfinite(usd) or usd < 0:
            raise ValueError(f"cost must be a finite number of dollars >= 0, got {usd!r}")
        if usd:
            self._spent[tenant] = self._spent.get(tenant, 0.0) + float(usd)
            if self._unsynced is not None:
                self._unsynced[tenant] = self._unsynced.get(tenant, 0.0) + float(usd)
        if model is not None and tokens > 0:
            p = float(usd) / tokens
            old = self._price.get(model)  # a peak EWMA (Finagle's): up at once, down slowly; a budget is better
            self._price[model] = p if old is None or p > old else old + _PRICE_ALPHA * (p - old)  # refused early

    def spent(self, tenant: str) -> float:
        return self._spent.get(tenant, 0.0)

    def held(self, tenant: str) -> float:
        """Dollars the tenant's requests in flight are expected to cost."""
        return self._held.get(tenant, 0.0)

    def reset(self, tenant: str | None = None) -> None:
        """Forget the spend of one tenant (or of all): a new billing period.  What is in flight stays held."""
        if tenant is None:
            self._spent.clear()
        else:
            self._spent.pop(tenant, None)

    # -- shared among gateways (steersman.state.shared_limits does the IO) -------------------------------------

    def share(self) -> None:
        """Keep the spend charged here (:meth:`take_spend`) for a sync with the other gateways."""
        if self._unsynced is None:
            self._unsynced = {}

    def unsynced(self, tenant: str) -> bool:
        """Whether the tenant spent here since the last :meth:`take_spend` (shared spend only)."""
        return bool(self._unsynced) and tenant in self._unsynced

    def take_spend(self) -> dict[str, float]:
        """Dollars each tenant spent here since the last call."""
        out, self._unsynced = self._unsynced or {}, {}
        return out

    def restore_spend(self, spend: dict[str, float]) -> None:
        """Spend a failed sync could not hand over: it goes with the next one."""
        unsynced = self._unsynced if self._unsynced is not None else {}
        for tenant, usd in spend.items():
            unsynced[tenant] = unsynced.get(tenant, 0.0) + usd
        self._unsynced = unsynced

    def apply_shared(self, tenant: str, spent_usd: float, others_held_usd: float) -> None:
        """Every gateway together has spent ``spent_usd`` for ``tenant`` (with what this one handed over), and the
        others' requests in flight hold ``others_held_usd``: the spend here is that, plus what was charged since."""
        self._spent[tenant] = spent_usd + (self._unsynced or {}).get(tenant, 0.0)
        if others_held_usd > 0:
            self._others[tenant] = others_held_usd
        else:
            self._others.pop(tenant, None)
