"""Runs the ordered stages of the request path under the one outcome contract."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from steersman.api.errors import ApiError, sse_error_event
from steersman.pipeline.context import RequestContext
from steersman.pipeline.outcome import Continue, Fail, Outcome, Respond

__all__ = ["Stage", "Pipeline", "send_error"]


@runtime_checkable
class Stage(Protocol):
    name: str

    async def run(self, ctx: RequestContext) -> Outcome: ...


def send_error(ctx: RequestContext, err: ApiError) -> None:
    """Answer with ``err``; if a stream already started, end it with an error event instead."""
    req = ctx.http
    ctx.status = ctx.status or err.status
    if not req.started:
        req.respond(err.status, err.body(), extra=err.header_lines())
    else:
        req.send(sse_error_event(err))
        req.end_stream()


class Pipeline:
    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = tuple(stages)

    async def handle(self, ctx: RequestContext) -> None:
        for stage in self.stages:
            out = await stage.run(ctx)
            if isinstance(out, Continue):
                continue
            if isinstance(out, Respond):
                return
            if isinstance(out, Fail):
                send_error(ctx, out.error)
                return
        raise RuntimeError("the request path ended without a response")  # a wiring bug, not a request error
