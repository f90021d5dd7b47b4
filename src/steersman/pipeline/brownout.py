"""The brown-out stage: under saturation, sheddable traffic moves to a cheaper model or is refused.

Runs after ``describe`` and before ``schedule``; the decision is the pure
:func:`steersman.reliability.brownout` over a fleet snapshot and the requested
model's own backlog in the gateway queue (another model's backlog says nothing
about this one: an idle model's sheddable traffic was refused while a busy one
queued).  Whether a model is in brown-out is the pure
:func:`steersman.reliability.brownout.browned_out`, with hysteresis: the stage
keeps each model's :class:`BrownoutState` (since when, when its backlog was last
deep) and reads the time from the gateway's clock.  It begins only when every
replica of the model is full.  A moved request is rewritten to the cheaper model
(its body's ``model`` field, the scheduling context: see :meth:`Brownout._move`),
its answers carry ``x-steersman-served-model``, and it is counted in
``steersman:brownout_total{action="moved"}``; a refused one gets 503 with
``Retry-After`` (``action="shed"``).  A request the cheaper model cannot hold
(:func:`holds`) stays on its own model.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import msgspec

from steersman.api.errors import ApiError
from steersman.obs.histogram import CounterFamily
from steersman.pipeline.context import RequestContext
from steersman.pipeline.forward import with_model
from steersman.pipeline.outcome import CONTINUE, Fail, Outcome, Retry
from steersman.policy.request import PriorityClass, SchedRequest
from steersman.policy.saturation import saturated
from steersman.policy.scorers import model_holds, sequence_tokens
from steersman.reliability.brownout import BrownoutState, MoveTo, Shed, browned_out, brownout
from steersman.text.lora import rekeyed

__all__ = ["Brownout", "full", "holds", "SERVED_MODEL"]

log = logging.getLogger(__name__)

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


def holds(snap, model: str, req: SchedRequest) -> bool:
    """Some replica serving ``model`` could ever hold ``req`` (its longest prompt and ``max_tokens``): the routing's
    own context check (:func:`steersman.policy.scorers.model_holds`), asked before a move: a request moved to a
    model none of whose replicas holds it was refused there with a 400 ``context_length_exceeded`` for a model its
    client never asked for."""
    return model_holds(snap, model, sequence_tokens(req))


class Brownout:
    name = "brownout"

    def __init__(self, gateway) -> None:
        self.gw = gateway
        self.depth = gateway.cfg.reliability.brownout_queue_depth
        #: the models in brown-out now (a model leaves once its backlog has been short for the stabilization window)
        self.states: dict[str, BrownoutState] = {}
        self.counts = CounterFamily("steersman:brownout", "Sheddable requests moved to a cheaper model or shed in brown-out.",
                                    ["model", "action"])
        gateway.metrics.registry.register(self.counts)

    async def run(self, ctx: RequestContext) -> Outcome:
        sched = ctx.sched
        if sched is None or sched.priority != PriorityClass.SHEDDABLE:
            return CONTINUE  # the fast path: only the sheddable class is ever browned out
        gw = self.gw
        model = ctx.model
        depth = gw.plane.waiting_for(model)
        was = self.states.get(model)
        if was is None and depth < self.depth:
            return CONTINUE  # not in brown-out, and this model's backlog is short (whatever other models' is)
        snap = gw.fleet.snapshot()
        settings = gw.scheduler_settings
        rel = gw.cfg.reliability
        now = gw.clock.now()
        state = browned_out(was, depth, lambda: full(snap, model, settings), now, rel)
        if state is None:
            if was is not None:
                del self.states[model]
                log.info("brown-out of %r ends after %.0f s (%d requests wait for it)", model, now - was.since, depth)
            return CONTINUE  # a replica of its own can take it (the queue drains), or the brown-out is over
        if was is None:
            log.info("brown-out of %r begins: %d requests wait for it, none of its replicas can take one", model, depth)
        self.states[model] = state
        act = brownout(sched.priority, model, depth, lambda m: full(snap, m, settings), gw.fleet.has_model, rel,
                       movable=sched.kind != "embedding", on=True, holds=lambda m: holds(snap, m, sched))
        if isinstance(act, Shed):
            self.counts.inc(model, "shed")
            return Fail(ApiError(503, act.reason[:1].upper() + act.reason[1:] + ".", "server_error", None, "brownout",
                                 act.retry_after), Retry.NEVER)
        if isinstance(act, MoveTo):
            keys = gw.fleet.lora_keys
            self._move(ctx, act.model, gw.expected_output(act.model, sched.tenant, sched.max_tokens),
                       keys.get(model, 0) ^ keys.get(act.model, 0))
            self.counts.inc(model, "moved")  # (once moved: nothing above can fail it now)
        return CONTINUE

    @staticmethod
    def _move(ctx: RequestContext, model: str, expected_output: int, rekey: int = 0) -> None:
        """Rewrite the request for ``model``: its body gets ``"model"`` again as its last member (the engines'
        JSON parsers, vLLM's and msgspec's, take the last of duplicate keys), not decoded and encoded again (an
        untyped decode refuses some of what the typed parser took: a number out of float range in a forwarded
        field was a 500).

        Its scheduling context becomes the one ``describe`` builds for ``model``: ``expected_output`` is that
        model's running estimate for the tenant (it sizes the KV the request holds and its predicted latency).  The
        prompt's shape (tokens, block hashes) is the same for every model: the gateway renders and tokenizes every
        prompt alike (``steersman.text``, engine-sim's tokenizer; ``api/prompt.py`` takes no model), so it is not
        computed again, only keyed anew when either model is a LoRA adapter (``rekey``: the two models' keys XORed,
        :mod:`steersman.text.lora`); whether ``model`` can hold it at all was asked before the move (:func:`holds`)."""
        http = ctx.http
        http.body = with_model(ctx.body, model)
        if ctx.request is not None:
            ctx.request = msgspec.structs.replace(ctx.request, model=model)
        ctx.model = model
        ctx.sched = replace(ctx.sched, model=model, expected_output=expected_output,
                            block_hashes=rekeyed(ctx.sched.block_hashes, rekey))
        if model.isascii() and model.isprintable():  # (a header value: no CR/LF from an engine's model list)
            http.extra_headers += b"%b: %b\r\n" % (SERVED_MODEL, model.encode())
        served_by = getattr(http, "served_by", None)  # a Responses call: its Response names the model that answered
        if served_by is not None:
            served_by(model)
