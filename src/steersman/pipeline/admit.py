"""Request-path stages between parsing and forwarding: who is asking, what it is, whether and where it runs.

``authenticate`` (API key -> tenant) -> ``describe`` (the typed :class:`SchedRequest`:
latency budget, workflow context, prompt shape) -> ``schedule`` (the control
plane: admit, route now, or wait in the gateway queue until dispatched, shed or
expired).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from steersman.api.errors import ApiError, bad_request, unauthorized
from steersman.api.headers import DEADLINE, parse_budget
from steersman.api.prompt import batch_shape
from steersman.text.lora import rekeyed
from steersman.control.plane import Dispatch, Refuse, Wait
from steersman.control.tenants import AuthError, TenantDirectory
from steersman.control.workflow import WorkflowHeaderError, WorkflowTracker, effective_priority, parse_workflow_headers
from steersman.pipeline.context import RequestContext
from steersman.pipeline.outcome import CONTINUE, Fail, Outcome, Retry
from steersman.policy.base import Queue, Reject, Route
from steersman.policy.request import SchedRequest

__all__ = ["Authenticate", "Describe", "Schedule", "refusal_error"]


def refusal_error(r: Refuse) -> ApiError:
    kind = ("insufficient_quota" if r.code == "insufficient_quota" else "rate_limit_error" if r.status == 429
            else "server_error" if r.status >= 500 else "invalid_request_error")  # (OpenAI's types)
    return ApiError(r.status, r.reason[:1].upper() + r.reason[1:] + ".", kind, r.param, r.code, r.retry_after)


class Authenticate:
    name = "authenticate"

    def __init__(self, tenants: TenantDirectory) -> None:
        self.tenants = tenants

    async def run(self, ctx: RequestContext) -> Outcome:
        got = self.tenants.authenticate(ctx.http.headers.get("authorization"))
        if isinstance(got, AuthError):
            return Fail(unauthorized(got), Retry.NEVER)
        ctx.tenant = got
        return CONTINUE


class Describe:
    """Build the request's typed scheduling context."""

    name = "describe"

    def __init__(self, gateway) -> None:
        self.gw = gateway

    async def run(self, ctx: RequestContext) -> Outcome:
        gw = self.gw
        req = ctx.request
        assert req is not None and ctx.tenant is not None
        now = gw.clock.now()
        headers = ctx.http.headers
        try:
            budget = parse_budget(headers, now, gw.scheduler_settings)
            wf_headers = parse_workflow_headers(headers, gw.cfg.admission.workflow_id_max_chars)
        except ApiError as e:
            return Fail(e, Retry.NEVER)
        except WorkflowHeaderError as e:
            return Fail(bad_request(str(e), e.header, "invalid_header"), Retry.NEVER)
        # a view only: the entry is made once the request is admitted (Schedule), not for one its limits refuse
        workflow = gw.workflows.peek(ctx.tenant.name, wf_headers, now) if wf_headers is not None else None
        tokens, hashes, longest = batch_shape(req, gw.block_size)
        key = gw.fleet.lora_keys.get(ctx.model)
        if key is not None:  # a LoRA adapter's KV is its own (steersman.text.lora)
            hashes = rekeyed(hashes, key)
        limit = req.output_limit
        ctx.sched = SchedRequest(
            seq=ctx.seq, model=ctx.model, kind=ctx.kind, stream=req.stream, tenant=ctx.tenant.name,
            priority=effective_priority(ctx.tenant.priority, workflow, gw.cfg.admission.workflow_missed_demotion),
            arrival=ctx.started, prompt_tokens=tokens, block_hashes=hashes,
            max_tokens=limit, expected_output=gw.expected_output(ctx.model, ctx.tenant.name, limit),
            budget=budget, workflow=workflow, samples=req.n * _batch(req), longest_prompt_tokens=longest,
        )
        return CONTINUE


def _batch(req) -> int:
    """Prompts in the request: a completion may bring a batch (strings or token-id lists), each run ``n`` times."""
    p = getattr(req, "prompt", None)
    return len(p) if isinstance(p, list) and p and isinstance(p[0], (str, list)) else 1


class Schedule:
    """Admit and route through the control plane; wait in the gateway queue when told to."""

    name = "schedule"

    def __init__(self, gateway) -> None:
        self.gw = gateway

    async def run(self, ctx: RequestContext) -> Outcome:
        gw = self.gw
        assert ctx.sched is not None and ctx.tenant is not None
        if ctx.started_at is not None:
            return await self._reroute(ctx)
        out, shed = gw.plane.arrive(ctx, ctx.sched, ctx.tenant, gw.fleet.snapshot(), gw.clock.now())
        gw.notify(shed)
        if isinstance(out, Refuse):
            if out.code == "deadline_infeasible" and out.status < 500:  # too short for the request itself
                out = replace(out, param=DEADLINE)
            return Fail(refusal_error(out), Retry.NEVER)
        wf = ctx.sched.workflow
        if wf is not None:  # admitted (dispatched or queued): its workflow's entry is made or refreshed now
            gw.workflows.admitted(ctx.tenant.name, wf.workflow_id, wf.steps, gw.clock.now())
        if isinstance(out, Wait):
            return await self._wait(ctx)
        assert isinstance(out, Dispatch)
        gw.start_dispatch(ctx, out)
        return CONTINUE

    async def _wait(self, ctx: RequestContext) -> Outcome:
        """Wait in the gateway queue until the control plane dispatches the request (or refuses it)."""
        gw = self.gw
        ctx.waiter = gw.running_loop().create_future()
        gw.kick()
        try:
            out = await ctx.waiter
        except asyncio.CancelledError:
            gw.plane.abandon(ctx, gw.clock.now())  # the client left while queued
            raise
        finally:
            ctx.waiter = None
        if isinstance(out, Refuse):
            return Fail(refusal_error(out), Retry.NEVER)
        assert isinstance(out, Dispatch) and ctx.started_at is not None
        return CONTINUE  # notify() started the dispatch as it woke us: starting it again leaked a ticket

    async def _reroute(self, ctx: RequestContext) -> Outcome:
        """A retry or stream continuation: route again, already admitted, avoiding ``ctx.excluded``.

        The failed attempt's replica accounting ends once a new replica is chosen or the request
        waits in the gateway queue (:meth:`Accounting.left`: its cost is carried, and it is settled
        once at its end, as always); otherwise the request ends as it is.  When no replica can take
        it now, it waits in the gateway queue as a new arrival would (:meth:`ControlPlane.requeue`),
        not admitted again.
        """
        gw = self.gw
        old = ctx.started_at
        # a stream already under way (bytes reached the client) moves its admitted load: not new work; a retry before
        # any byte went out is new work to the gates (concurrency limit, saturation) and may have to wait
        req = replace(ctx.sched, excluded=frozenset(ctx.excluded), resumed=bool(ctx.bytes_sent))
        decision = gw.policy.pick(gw.fleet.snapshot(), req)
        if isinstance(decision, Route):
            gw.start_dispatch(ctx, Dispatch(decision, old.admit), gw.accounting.left(old))
            return CONTINUE
        if not isinstance(decision, Queue):
            err = ApiError(503, f"No other replica can take the request now: {decision.reason}.", "server_error", None,
                           decision.code if isinstance(decision, Reject) else "no_capacity",
                           decision.retry_after if isinstance(decision, Reject) and decision.retry_after is not None
                           else gw.scheduler_settings.no_replica_retry_after_s)
            return Fail(err, Retry.NEVER)
        ctx.started_at, ctx.ticket = gw.accounting.left(old), None  # not in flight there while it waits
        out, shed = gw.plane.requeue(ctx, req, old.admit, ctx.tenant.weight, gw.clock.now())
        gw.notify(shed)
        if isinstance(out, Refuse):
            return Fail(refusal_error(out), Retry.NEVER)
        return await self._wait(ctx)  # notify() dispatches it carrying the failed attempt's cost
