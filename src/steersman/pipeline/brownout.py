"""The brown-out stage: under saturation, sheddable traffic moves to a cheaper model or is refused.

Runs after ``describe`` and before ``schedule``; the decision is the pure
:func:`steersman.reliability.brownout` over a fleet snapshot and the gateway
queue's depth.  A moved request is rewritten to the cheaper model (its body's
``model`` field, the scheduling context) and counted in
``steersman_brownout_total{action="moved"}``; a refused one gets 503 with
``Retry-After`` (``action="shed"``).
"""

from __future__ import annotations

from dataclasses import replace

import msgspec

from steersman.api.errors import ApiError
from steersman.obs.histogram import CounterFamily
from steersman.pipeline.context import RequestContext
from steersman.pipeline.outcome import CONTINUE, Fail, Outcome, Retry
from steersman.policy.request import PriorityClass
from steersman.policy.saturation import saturated
from steersman.reliability.brownout import MoveTo, Shed, brownout

__all__ = ["Brownout"]


class Brownout:
    name = "brownout"

    def __init__(self, gateway) -> None:
        self.gw = gateway
        self.counts = CounterFamily("steersman_brownout", "Sheddable requests moved to a cheaper model or shed in brown-out.",
                                    ["model", "action"])
        gateway.metrics.registry.register(self.counts)

    async def run(self, ctx: RequestContext) -> Outcome:
        sched = ctx.sched
        if sched is None or sched.priority != PriorityClass.SHEDDABLE:
            return CONTINUE  # the fast path: only the sheddable class is ever browned out
        gw = self.gw
        snap = gw.fleet.snapshot()

        def full(model: str) -> bool:
            idx = snap.candidates(model)
            return idx.size == 0 or bool(saturated(snap, idx, gw.scheduler_settings).all())

        act = brownout(sched.priority, ctx.model, gw.plane.waiting, full, gw.fleet.has_model, gw.cfg.reliability,
                       movable=sched.kind != "embedding")
        if isinstance(act, Shed):
            self.counts.inc(ctx.model, "shed")
            return Fail(ApiError(503, act.reason[:1].upper() + act.reason[1:] + ".", "server_error", None, "brownout",
                                 act.retry_after), Retry.NEVER)
        if isinstance(act, MoveTo):
            self.counts.inc(ctx.model, "moved")
            data = msgspec.json.decode(ctx.body)  # (as the request was decoded: orjson refuses some of what it took)
            data["model"] = act.model
            ctx.http.body = msgspec.json.encode(data)
            if ctx.request is not None:
                ctx.request = msgspec.structs.replace(ctx.request, model=act.model)
            ctx.model = act.model
            ctx.sched = replace(sched, model=act.model)
        return CONTINUE
