"""The stages of the gateway's request path: parse -> resolve model -> route (-> forward)."""

from __future__ import annotations

from steersman.api.errors import ApiError, not_found_model, unavailable
from steersman.api.schema import decode_chat, decode_completion
from steersman.config import GatewaySettings
from steersman.fleet.state import Fleet
from steersman.pipeline.context import RequestContext
from steersman.pipeline.outcome import CONTINUE, Fail, Outcome, Retry
from steersman.policy.base import Reject, RequestView, RoutingPolicy

__all__ = ["ParseRequest", "ResolveModel", "RouteRequest"]


class ParseRequest:
    """Decode the body (already size-limited by the HTTP server) into a typed request."""

    name = "parse"

    def __init__(self, settings: GatewaySettings) -> None:
        self.max_tokens = settings.max_tokens_limit

    async def run(self, ctx: RequestContext) -> Outcome:
        try:
            if ctx.kind == "chat":
                ctx.request = decode_chat(ctx.body, self.max_tokens)
            else:
                ctx.request = decode_completion(ctx.body, self.max_tokens)
        except ApiError as e:
            return Fail(e, Retry.NEVER)
        ctx.model = ctx.request.model
        return CONTINUE


class ResolveModel:
    """Unknown models are a 404 naming the model."""

    name = "resolve-model"

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    async def run(self, ctx: RequestContext) -> Outcome:
        if not self.fleet.has_model(ctx.model):
            return Fail(not_found_model(ctx.model), Retry.NEVER)
        return CONTINUE


class RouteRequest:
    """Ask the routing policy for a replica, on a frozen snapshot of the fleet."""

    name = "route"

    def __init__(self, fleet: Fleet, policy: RoutingPolicy) -> None:
        self.fleet = fleet
        self.policy = policy

    async def run(self, ctx: RequestContext) -> Outcome:
        req = ctx.request
        assert req is not None
        view = RequestView(
            model=ctx.model, kind=ctx.kind, stream=req.stream, max_tokens=req.output_limit, priority=req.priority, seq=ctx.seq
        )
        decision = self.policy.pick(self.fleet.snapshot(), view)
        if isinstance(decision, Reject):
            return Fail(unavailable(decision.reason, decision.retry_after, "no_healthy_replica"), Retry.NEVER)
        ctx.replica = decision.replica
        return CONTINUE
