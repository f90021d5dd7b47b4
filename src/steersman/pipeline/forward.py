"""The last stage: relay the request to the chosen replica and stream the answer back.

Engine bytes are written to the client from the upstream connection's
``data_received`` (no buffering, no await per chunk); a client that cannot keep
up pauses reading from the engine.  A client that disconnects cancels the
handler, which drops the engine connection, which makes the engine abort.
"""

from __future__ import annotations

from steersman.api.errors import ApiError, upstream_failed
from steersman.clock import Clock
from steersman.engines.base import Exchange, UpstreamError
from steersman.fleet.state import Fleet
from steersman.obs.metrics import GatewayMetrics
from steersman.pipeline.context import RequestContext
from steersman.pipeline.outcome import RESPONDED, Fail, Outcome, Retry

__all__ = ["Forward"]


class _Relay:
    """Body sink: writes engine bytes to the client and times the stream."""

    __slots__ = ("ctx", "fleet", "ticket", "now", "ttft", "itl", "last", "prev", "chunk", "events")

    def __init__(self, ctx: RequestContext, fleet: Fleet, clock: Clock, metrics: GatewayMetrics) -> None:
        self.ctx = ctx
        self.fleet = fleet
        self.ticket = ctx.ticket
        self.events = 0
        self.now = clock.now
        pm = metrics.model(ctx.model)
        self.ttft = pm.ttft
        self.itl = pm.itl
        self.last: float | None = None
        self.prev = self.chunk = b""  # the last two chunks: where the final [DONE] is

    def __call__(self, data: bytes) -> None:
        t = self.now()
        if self.last is None:
            self.ttft.observe(t - self.ctx.started)
            self.ctx.bytes_sent = True
            if self.ticket is not None:
                self.fleet.first_token(self.ticket)
        elif b"\n\n" in data:
            self.itl.observe(t - self.last)
        self.events += data.count(b"data: ")
        self.last = t
        self.prev, self.chunk = self.chunk, data
        self.ctx.http.send(data)

    @property
    def saw_done(self) -> bool:
        return (self.prev[-16:] + self.chunk).rstrip().endswith(b"[DONE]")


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
        ex: Exchange | None = None
        try:
            try:
                ex = await rep.adapter.send(rep.address, ctx.path, ctx.body)
            except UpstreamError as e:
                self.metrics.upstream_error(rep.name, "send" if e.connected else "connect")
                if not e.connected:
                    self.fleet.set_healthy(index, False)  # passive detection; the scraper restores it
                return Fail(upstream_failed(f"Engine {rep.name} is unreachable: {e}", 502), Retry.SAFE)
            if ex.status != 200:
                return await self._engine_error(ctx, rep.name, ex)
            if not ctx.stream:
                body = await ex.read()
                if ctx.ticket is not None:
                    self.fleet.first_token(ctx.ticket)
                ctx.output_tokens = _usage_int(body, b'"completion_tokens":') or 0
                ctx.cached_tokens = _usage_int(body, b'"cached_tokens":')
                ctx.status = 200
                ctx.http.respond(200, body)
                return RESPONDED
            relay = _Relay(ctx, self.fleet, self.clock, self.metrics)
            try:
                return await self._relay(ctx, ex, relay)
            finally:
                ctx.output_tokens = max(0, relay.events - 2)  # one event per token, minus the role chunk and [DONE]
        except UpstreamError as e:
            self.metrics.upstream_error(rep.name, "broken")
            retry = Retry.CONTINUE_ONLY if ctx.bytes_sent else Retry.SAFE
            return Fail(upstream_failed(f"Engine {rep.name} failed mid-response: {e}", 502), retry)
        finally:
            if ex is not None:
                ex.abort()  # no-op when the response completed

    async def _engine_error(self, ctx: RequestContext, name: str, ex: Exchange) -> Outcome:
        body = await ex.read()
        if ex.status >= 500:
            self.metrics.upstream_error(name, f"http_{ex.status}")
            detail = body[:300].decode("utf-8", "replace")
            return Fail(upstream_failed(f"Engine {name} answered {ex.status}: {detail}", 502), Retry.SAFE)
        # the engine refused the request itself (e.g. context too long): relay its OpenAI error
        ctx.status = ex.status
        ctype = ex.headers.get("content-type", "application/json").encode("latin-1")
        ctx.http.respond(ex.status, body, ctype)
        return RESPONDED

    async def _relay(self, ctx: RequestContext, ex: Exchange, relay: _Relay) -> Outcome:
        req = ctx.http
        req.start_stream(200, b"text/event-stream", b"X-Accel-Buffering: no\r\n")
        ctx.status = 200
        req.producer = ex
        ex.pipe(relay)
        await ex.done()
        if not relay.saw_done:
            err = ApiError(502, "The engine ended the stream without finishing it.", "server_error", None, "incomplete_stream")
            return Fail(err, Retry.CONTINUE_ONLY if ctx.bytes_sent else Retry.SAFE)
        req.end_stream()
        return RESPONDED


def _usage_int(body: bytes, key: bytes) -> int | None:
    """An integer field of the ``usage`` object of a whole response (the last occurrence), or None."""
    i = body.rfind(key)
    if i == -1:
        return None
    j = i + len(key)
    k = j
    while k < len(body) and body[k : k + 1] in b" 0123456789":
        k += 1
    try:
        return int(body[j:k])
    except ValueError:
        return None
