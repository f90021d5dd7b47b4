"""The last stage: relay the request to the chosen replica and stream the answer back.

Bytes are written to the client as they arrive from the engine (no buffering).
A client that disconnects cancels the handler, which closes the upstream
connection, which makes the engine abort the request.
"""

from __future__ import annotations

from aiohttp import web

from steersman.api.errors import ApiError, upstream_failed
from steersman.clock import Clock
from steersman.engines.base import UpstreamError, UpstreamResponse
from steersman.fleet.state import Fleet
from steersman.obs.metrics import GatewayMetrics
from steersman.pipeline.context import RequestContext
from steersman.pipeline.outcome import Fail, Outcome, Respond, Retry

__all__ = ["Forward"]

_JSON = {"Content-Type": "application/json"}
_SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Forward:
    name = "forward"

    def __init__(self, fleet: Fleet, metrics: GatewayMetrics, clock: Clock) -> None:
        self.fleet = fleet
        self.metrics = metrics
        self.clock = clock

    async def run(self, ctx: RequestContext) -> Outcome:
        index = ctx.replica
        assert index is not None
        rep = self.fleet.replicas[index]
        self.fleet.begin(index)
        up: UpstreamResponse | None = None
        try:
            try:
                up = await rep.adapter.send(rep.address, ctx.path, ctx.body, _JSON)
            except UpstreamError as e:
                self.metrics.upstream_error(rep.name, "connect" if not e.connected else "send")
                if not e.connected:
                    self.fleet.set_healthy(index, False)  # passive detection; the scraper restores it
                return Fail(upstream_failed(f"Engine {rep.name} is unreachable: {e}", 502), Retry.SAFE)
            if up.status != 200:
                return await self._engine_error(ctx, rep.name, up)
            if not ctx.stream:
                body = await up.read()
                up.release()
                up = None
                ctx.status = 200
                return Respond(web.Response(status=200, body=body, headers=_JSON))
            return await self._relay(ctx, up)
        except UpstreamError as e:
            self.metrics.upstream_error(rep.name, "broken")
            retry = Retry.CONTINUE_ONLY if ctx.bytes_sent else Retry.SAFE
            return Fail(upstream_failed(f"Engine {rep.name} failed mid-response: {e}", 502), retry)
        finally:
            self.fleet.end(index)
            if up is not None:
                up.close()

    async def _engine_error(self, ctx: RequestContext, name: str, up: UpstreamResponse) -> Outcome:
        body = await up.read()
        if up.status >= 500:
            self.metrics.upstream_error(name, f"http_{up.status}")
            return Fail(upstream_failed(f"Engine {name} answered {up.status}: {body[:300].decode('utf-8', 'replace')}", 502), Retry.SAFE)
        # the engine refused the request itself (e.g. context too long): relay its OpenAI error
        ctx.status = up.status
        ctype = up.headers.get("Content-Type", "application/json")
        return Respond(web.Response(status=up.status, body=body, headers={"Content-Type": ctype}))

    async def _relay(self, ctx: RequestContext, up: UpstreamResponse) -> Outcome:
        resp = web.StreamResponse(status=200, headers=_SSE)
        await resp.prepare(ctx.http)
        ctx.response = resp
        ctx.status = 200
        pm = self.metrics.model(ctx.model)
        now = self.clock.now
        last = None
        tail = b""
        try:
            async for chunk in up.chunks():
                tail = (tail + chunk)[-16:]
                t = now()
                if last is None:
                    pm.ttft.observe(t - ctx.started)
                    ctx.bytes_sent = True
                elif b"\n\n" in chunk:
                    pm.itl.observe(t - last)
                last = t
                await resp.write(chunk)
        except (ConnectionResetError, ConnectionError):
            return Respond(resp)  # the client left; closing upstream (finally) cancels the engine's work
        if not tail.rstrip().endswith(b"[DONE]"):
            err = ApiError(502, "The engine ended the stream without finishing it.", "server_error", None, "incomplete_stream")
            return Fail(err, Retry.CONTINUE_ONLY if ctx.bytes_sent else Retry.SAFE)
        await resp.write_eof()
        return Respond(resp)
