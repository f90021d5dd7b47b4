"""Runs the ordered stages of the request path under the one outcome contract."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from aiohttp import web

from steersman.api.errors import ApiError, sse_error_event
from steersman.pipeline.context import RequestContext
from steersman.pipeline.outcome import Continue, Fail, Outcome, Respond

__all__ = ["Stage", "Pipeline"]


@runtime_checkable
class Stage(Protocol):
    name: str

    async def run(self, ctx: RequestContext) -> Outcome: ...


class Pipeline:
    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = tuple(stages)

    async def handle(self, ctx: RequestContext) -> web.StreamResponse:
        for stage in self.stages:
            out = await stage.run(ctx)
            if isinstance(out, Continue):
                continue
            if isinstance(out, Respond):
                return out.response
            if isinstance(out, Fail):
                return await self._fail(ctx, out.error)
        raise RuntimeError("the request path ended without a response")  # a wiring bug, not a request error

    @staticmethod
    async def _fail(ctx: RequestContext, err: ApiError) -> web.StreamResponse:
        ctx.status = err.status
        resp = ctx.response
        if resp is None:
            return err.response()
        # the stream already started: end it with an error event, never restart it
        try:
            await resp.write(sse_error_event(err))
            await resp.write_eof()
        except ConnectionError:
            pass
        return resp
