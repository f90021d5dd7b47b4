"""The brown-out stage: under saturation, sheddable traffic moves to a cheaper model or is refused.

Runs after ``describe`` and before ``schedule``; the decision is the
:class:`~steersman.reliability.brownout_gate.BrownoutGate`'s (the twin asks one
too): the pure :func:`steersman.reliability.brownout` over a fleet snapshot and
the requested model's own backlog in the gateway queue (another model's backlog
says nothing about this one: an idle model's sheddable traffic was refused while
a busy one queued).  Whether a model is in brown-out is the pure
:func:`steersman.reliability.brownout.browned_out`, with hysteresis: the gate
keeps each model's state (since when, when its backlog was last deep) and is
given the time from the gateway's clock.  It begins only when every
replica of the model is full.  A moved request is rewritten to the cheaper model
(its body's ``model`` field, the scheduling context: see :meth:`Brownout._move`),
its answers carry ``x-steersman-served-model``, and it is counted in
``steersman:brownout_total{action="moved"}``; a refused one gets 503 with
``Retry-After`` (``action="shed"``).  A request the cheaper model cannot hold
(:func:`steersman.reliability.brownout_gate.holds`) stays on its own model.
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
from steersman.reliability.brownout import MoveTo, Shed
from steersman.reliability.brownout_gate import BrownoutGate
from steersman.text.lora import rekeyed

__all__ = ["Brownout", "SERVED_MODEL"]

SERVED_MODEL = b"x-steersman-served-model"  # the model that answered, when brown-out moved the request


class Brownout:
    name = "brownout"

    def __init__(self, gateway) -> None:
        self.gw = gateway
        self.gate = BrownoutGate(gateway.cfg.reliability, gateway.scheduler_settings)  # the twin asks one alike
        self.counts = CounterFamily("steersman:brownout", "Sheddable requests moved to a cheaper model or shed in brown-out.",
                                    ["model", "action"])
        gateway.metrics.registry.register(self.counts)

    async def run(self, ctx: RequestContext) -> Outcome:
        sched = ctx.sched
        if sched is None or sched.priority != PriorityClass.SHEDDABLE:
            return CONTINUE  # the fast path: only the sheddable class is ever browned out
        gw = self.gw
        model = ctx.model
        act = self.gate.decide(sched, gw.plane.waiting_for(model), gw.fleet.snapshot, gw.fleet.has_model,
                               gw.clock.now(), movable=sched.kind != "embedding")
        if isinstance(act, Shed):
            self.counts.inc(model, "shed")
            return Fail(ApiError(503, act.reason[:1].upper() + act.reason[1:] + ".", "server_error", None, "brownout",
                                 gw.plane.settings.no_replica_retry_after_s), Retry.NEVER)
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
