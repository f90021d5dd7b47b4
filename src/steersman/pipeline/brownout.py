"""The brown-out stage: under saturation, sheddable traffic moves to a cheaper model or is refused.

Runs after ``describe`` and before ``schedule``; the decision is the pure
:func:`steersman.reliability.brownout` over a fleet snapshot and the requested
model's own backlog in the gateway queue, asked only when every replica of that
model is full (another model's backlog says nothing about this one: an idle model's
sheddable traffic was refused while a busy one queued).  A moved request is
rewritten to the cheaper model (its body's ``model`` field, the scheduling context),
its answers carry ``x-steersman-served-model``, and it is counted in
``steersman_brownout_total{action="moved"}``; a refused one gets 503 with
``Retry-After`` (``action="shed"``).
"""

from __future__ import annotations

from dataclasses import replace

import msgspec

from steersman.api.errors import ApiError
from steersman.obs.histogram import CounterFamily
from steersman.pipeline.context import RequestContext
from steersman.pipeline.forward import with_model
from steersman.pipeline.outcome import CONTINUE, Fail, Outcome, Retry
from steersman.policy.request import PriorityClass
from steersman.policy.saturation import saturated
from steersman.reliability.brownout import MoveTo, Shed, brownout

__all__ = ["Brownout", "full", "SERVED_MODEL"]

SERVED_MODEL = b"x-steersman-served-model"  # the model that answered, when brown-out moved the request


def full(snap, model: str, settings) -> bool:
    """No replica of ``model`` can take a request now: none is in rotation (healthy, warm, and not ejected nor
    behind an open breaker: the guard's panic routing would send a moved request to a replica it took out for
    failing), and each left is at its adaptive concurrency limit or saturated."""
    idx = snap.candidates(model)
    if idx.size and snap.blocked_until is not None:
        idx = idx[snap.blocked_until[idx] <= snap.time]
    if idx.size and snap.limits is not None:
        idx = idx[snap.in_flight[idx] < snap.limits[idx]]
    return idx.size == 0 or bool(saturated(snap, idx, settings).all())


class Brownout:
    name = "brownout"

    def __init__(self, gateway) -> None:
        self.gw = gateway
        self.depth = gateway.cfg.reliability.brownout_queue_depth
        self.counts = CounterFamily("steersman_brownout", "Sheddable requests moved to a cheaper model or shed in brown-out.",
                                    ["model", "action"])
        gateway.metrics.registry.register(self.counts)

    async def run(self, ctx: RequestContext) -> Outcome:
        sched = ctx.sched
        if sched is None or sched.priority != PriorityClass.SHEDDABLE:
            return CONTINUE  # the fast path: only the sheddable class is ever browned out
        gw = self.gw
        depth = gw.plane.waiting_for(ctx.model)
        if depth < self.depth:
            return CONTINUE  # this model's backlog is short (whatever other models' is)
        snap = gw.fleet.snapshot()
        settings = gw.scheduler_settings
        if not full(snap, ctx.model, settings):
            return CONTINUE  # a replica of its own can take it: the queue drains
        act = brownout(sched.priority, ctx.model, depth, lambda m: full(snap, m, settings), gw.fleet.has_model,
                       gw.cfg.reliability, movable=sched.kind != "embedding")
        if isinstance(act, Shed):
            self.counts.inc(ctx.model, "shed")
            return Fail(ApiError(503, act.reason[:1].upper() + act.reason[1:] + ".", "server_error", None, "brownout",
                                 act.retry_after), Retry.NEVER)
        if isinstance(act, MoveTo):
            asked = ctx.model
            self._move(ctx, act.model)
            self.counts.inc(asked, "moved")  # (once moved: nothing above can fail it now)
        return CONTINUE

    @staticmethod
    def _move(ctx: RequestContext, model: str) -> None:
        """Rewrite the request for ``model``: its body gets ``"model"`` again as its last member (the engines'
        JSON parsers, vLLM's and msgspec's, take the last of duplicate keys), not decoded and encoded again (an
        untyped decode refuses some of what the typed parser took: a number out of float range in a forwarded
        field was a 500)."""
        http = ctx.http
        http.body = with_model(ctx.body, model)
        if ctx.request is not None:
            ctx.request = msgspec.structs.replace(ctx.request, model=model)
        ctx.model = model
        ctx.sched = replace(ctx.sched, model=model)
        if model.isascii() and model.isprintable():  # (a header value: no CR/LF from an engine's model list)
            http.extra_headers += b"%b: %b\r\n" % (SERVED_MODEL, model.encode())
        served_by = getattr(http, "served_by", None)  # a Responses call: its Response names the model that answered
        if served_by is not None:
            served_by(model)
