"""The first stages of the gateway's request path: parse the body, resolve the model."""

from __future__ import annotations

from steersman.api.embeddings import decode_embedding
from steersman.api.errors import ApiError, not_found_model
from steersman.api.schema import body_headers_error, decode_chat, decode_completion
from steersman.config import GatewaySettings
from steersman.fleet.state import Fleet
from steersman.pipeline.context import RequestContext
from steersman.pipeline.outcome import CONTINUE, Fail, Outcome, Retry

__all__ = ["ParseRequest", "ResolveModel"]


class ParseRequest:
    """Decode the body (already size-limited by the HTTP server) into a typed request."""

    name = "parse"

    def __init__(self, settings: GatewaySettings) -> None:
        self.max_tokens = settings.max_tokens_limit
        self.max_logprobs = settings.max_logprobs
        self.max_sequences = settings.max_completion_sequences

    async def run(self, ctx: RequestContext) -> Outcome:
        bad = body_headers_error(ctx.http.headers)
        if bad is not None:
            return Fail(bad, Retry.NEVER)
        try:
            if ctx.kind == "chat":
                ctx.request = decode_chat(ctx.body, self.max_tokens, self.max_logprobs)
            elif ctx.kind == "completion":
                ctx.request = decode_completion(ctx.body, self.max_tokens, self.max_logprobs, self.max_sequences)
            else:
                ctx.request = decode_embedding(ctx.body)
        except ApiError as e:
            return Fail(e, Retry.NEVER)
        ctx.model = ctx.requested_model = ctx.request.model
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
