"""The overload guard: when the gateway's own core is saturated, new work is refused before it costs more.

Every request and relayed chunk shares the gateway's one event loop.  Past what one
process can relay, admitting more makes every stream in flight slower (the loop runs
everything late) without serving more.  With ``gateway.overload_loop_lag_s`` set, a
new request arriving while the loop has been at least that late on every sample of
the last half second (:attr:`steersman.obs.looplag.LoopLag.sustained`) gets 503 with
``Retry-After`` once its tenant and model are known, before it is described, routed or sent:
clients back off or go to another gateway replica.  Critical tenants are still
admitted.  Counted in ``steersman_overload_refused_total``.  Off by default.
"""

from __future__ import annotations

from steersman.api.errors import ApiError
from steersman.obs.histogram import CounterFamily
from steersman.pipeline.context import RequestContext
from steersman.pipeline.outcome import CONTINUE, Fail, Outcome, Retry
from steersman.policy.request import PriorityClass

__all__ = ["Overload", "gateway_overloaded"]


def gateway_overloaded(priority: PriorityClass, sustained_lag_s: float, threshold_s: float | None) -> bool:
    """Refuse this request now?  (Pure: the guard's whole rule.)"""
    return threshold_s is not None and priority != PriorityClass.CRITICAL and sustained_lag_s >= threshold_s


class Overload:
    name = "overload"

    def __init__(self, gateway) -> None:
        self.threshold = gateway.settings.overload_loop_lag_s
        self.lag = gateway.metrics.loop_lag
        self.refused = CounterFamily("steersman_overload_refused", "New requests refused while the gateway's own "
                                     "event loop was saturated (gateway.overload_loop_lag_s).", ["model"])
        gateway.metrics.registry.register(self.refused)

    async def run(self, ctx: RequestContext) -> Outcome:
        if self.threshold is None:
            return CONTINUE
        assert ctx.tenant is not None
        lag = self.lag.sustained
        if not gateway_overloaded(ctx.tenant.priority, lag, self.threshold):
            return CONTINUE
        self.refused.inc(ctx.model)
        return Fail(ApiError(503, f"The gateway is overloaded (its event loop has run {lag * 1e3:.0f} ms late for "
                                  "0.5 s); retry shortly.", "server_error", None, "gateway_overloaded", 1.0),
                    Retry.NEVER)
