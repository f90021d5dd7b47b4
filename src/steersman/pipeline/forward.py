"""The last stage: relay the request to the chosen replica and stream the answer back.

Engine bytes are parsed as they arrive (:class:`~steersman.engines.sse.SseParser`)
and only complete events are written to the client, from the upstream
connection's ``data_received`` (no await per chunk); a client that cannot keep
up pauses reading from the engine.  Each event is validated and recorded in the
request's :class:`~steersman.pipeline.continuation.Continuation` (text emitted,
token count, finish reason), so when the engine dies mid-stream the runner can
call this stage again on another replica and the stream continues where it
stopped: the client sees one stream, token for token.  A malformed engine event
ends the stream with an error event.  A client that disconnects cancels the
handler, which drops the engine connection, which makes the engine abort.
"""

from __future__ import annotations

import msgspec

from steersman.api.body import with_member
from steersman.api.errors import ApiError, engine_error_body, refused_with_5xx, upstream_failed
from steersman.clock import Clock
from steersman.config import DEFAULTS
from steersman.engines.base import Exchange, UpstreamError
from steersman.engines.sse import SseError, SseParser
from steersman.fleet.state import Fleet
from steersman.obs.histogram import CounterFamily
from steersman.obs.metrics import GatewayMetrics
from steersman.pipeline.context import RequestContext
from steersman.pipeline.continuation import BadEvent, Continuation
from steersman.obs.tracing import OtlpTracer, PassThrough
from steersman.pipeline.outcome import RESPONDED, Fail, Outcome, Respond, Retry
from steersman.policy.request import PROMPT_FIELD

__all__ = ["Forward", "with_priority", "with_model"]

_decode_str = msgspec.json.Decoder(str).decode
_DONE_EVENT = b"data: [DONE]\n\n"


def _several_texts(inner: bytes, mid: bytes) -> list[str] | None:
    """The texts of a read of several plain token events back to back (an engine ahead of a busy gateway),
    given the read less the first event's head and the last one's tail; None if it is anything else.

    Split at ``mid``, the bytes between two such events' strings: a JSON string cannot hold a raw newline,
    which ``mid`` has, so the read is such events exactly when every piece decodes as one string.
    """
    try:
        return [_decode_str(p) for p in inner.split(mid)]
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None  # not plain token events only: the SSE parser takes the read (and says what is wrong)


def _frame(payloads: list[bytes]) -> bytes:
    """SSE events carrying ``payloads`` (a multi-line payload becomes several ``data:`` lines)."""
    if any(10 in p for p in payloads):  # a "\n"
        payloads = [p.replace(b"\n", b"\ndata: ") for p in payloads]
    return b"data: " + b"\n\ndata: ".join(payloads) + b"\n\n"


class _Relay:
    """Body sink: parses engine events, records them, writes them to the client and times the stream."""

    __slots__ = ("ctx", "fleet", "ticket", "now", "ttft", "itl", "last", "parser", "cont", "resumed", "error", "ex",
                 "_fp", "_fs", "_mid")

    def __init__(self, ctx: RequestContext, fleet: Fleet, clock: Clock, metrics: GatewayMetrics,
                 cont: Continuation, resumed: bool, max_event_bytes: int, ex: Exchange) -> None:
        self.ctx = ctx
        self.fleet = fleet
        self.ticket = ctx.ticket
        self.now = clock.now
        pm = metrics.model(ctx.model)
        self.ttft = pm.ttft
        self.itl = pm.itl
        self.last: float | None = None
        self.parser = SseParser(max_event_bytes)
        self.cont = cont
        self.resumed = resumed  # a continuation leg: events are rewritten
        self.error: str | None = None
        self.ex = ex
        self._fp = self._fs = b""  # a whole plain token event's bytes around its text, once the stream showed one
        self._mid = b""  # the bytes between two plain token events' texts (``_fs + _fp``)

    def __call__(self, data: bytes) -> None:
        cont = self.cont
        if self.error is not None or cont.done:
            return
        fp = self._fp
        if not fp and cont._fh and not self.resumed:  # the stream just showed its first plain token event
            fp = self._fp = b"data: " + cont._fh
            self._fs = cont._ft + b"\n\n"
            self._mid = self._fs + fp
        if fp and data.startswith(fp) and data.endswith(self._fs) and not self.parser.pending:
            inner = data[len(fp) : len(data) - len(self._fs)]
            try:
                text = _decode_str(inner)
            except (msgspec.DecodeError, UnicodeDecodeError):
                texts = _several_texts(inner, self._mid)
                if texts is not None:
                    cont.texts.extend(filter(None, texts))
                    cont.tokens += len(texts)
                    self.write(data)
                    return
            else:
                # the common read: exactly one plain token event, the same bytes as a validated one around
                # one JSON string (which cannot hold a raw newline, so this is one whole event)
                if text:
                    cont.texts.append(text)
                cont.tokens += 1
                self.write(data)
                return
        if data == _DONE_EVENT and not self.resumed and not self.parser.pending:
            cont.done = True  # the end of a first leg, alone in its read: nothing to parse (observe_many's [DONE])
            self.write(data)
            return
        try:
            payloads = self.parser.feed(data)
        except SseError as e:
            self.fail(f"malformed event stream: {e}")
            return
        if payloads:
            self.events(payloads, data)

    def events(self, payloads: list[bytes], data: bytes | None = None) -> None:
        """Record, validate and relay complete events; ``data``: the read they came in, if it was exactly them."""
        if self.resumed:
            self._rewritten(payloads)
            return
        try:
            n = self.cont.observe_many(payloads)  # first leg: relayed unchanged once valid
        except BadEvent as e:
            if e.good:
                self.write(_frame(payloads[: e.good]))
            self.fail(str(e))
            return
        if n == len(payloads) and data is not None and self.parser.clean:
            self.write(data)
        elif n:
            self.write(_frame(payloads[:n]))

    def _rewritten(self, payloads: list[bytes]) -> None:
        cont = self.cont
        kept: list[bytes] = []
        try:
            for p in payloads:
                q = cont.rewrite(p)
                if q is not None:
                    kept.append(q)
                if cont.done or cont.stopped:
                    break
        except BadEvent as e:
            if kept:
                self.write(_frame(kept))
            self.fail(str(e))
            return
        if cont.stopped and not cont.done:  # a stop string the failover split: the stream ends here, as it would have
            sched = self.ctx.sched
            self.write((_frame(kept) if kept else b"") + cont.closing_events(sched.prompt_tokens if sched is not None else None))
            self.ex.abort()  # the engine goes on past it: stop it (the relay ends the stream once the exchange is)
            return
        if kept:
            self.write(_frame(kept))

    def write(self, out: bytes) -> None:
        t = self.now()
        last, self.last = self.last, t
        ctx = self.ctx
        ctx.last_event_at = t
        if self.ticket is not None:  # the replica is making progress (a full one is not stalled: Fleet.streamed)
            self.fleet.streamed(self.ticket.replica, t)
        # the response's last bytes with [DONE] in them: the stream ends with this write (the terminator rides
        # along); Forward._relay would end it right after anyway, one loop turn and one syscall later
        end = self.ex.last and self.cont.done and self.error is None
        if last is not None:
            self.itl.observe(t - last)
            ctx.http.send(out, end)
        elif end:  # first and last at once: its first token is accounted before the stream (and the request) ends
            self._first(t)
            ctx.http.send(out, True)
        else:  # the first event of this leg: the client gets it before its bookkeeping (timed at ``t`` all the same)
            try:
                ctx.http.send(out, False)
            finally:
                self._first(t)

    def _first(self, t: float) -> None:
        """This leg's replica produced its first token at ``t``."""
        if not self.ctx.bytes_sent:
            self.ttft.observe(t - self.ctx.started)
            self.ctx.bytes_sent = True
        elif self.cont.last_sent is not None:  # a continuation's first event: the client's gap includes the failover
            self.itl.observe(t - self.cont.last_sent)
        if self.ticket is not None:
            self.fleet.first_token(self.ticket, t)

    def fail(self, message: str) -> None:
        self.error = message
        self.ex.abort()  # stop reading a broken stream; done() then raises


class _Producer:
    """The engine exchange as the client connection's producer: paused while the client cannot keep up.  The engine
    is silent then because the gateway stopped reading it: the idle sweep (``Pipeline.sweep_streams``) skips a paused
    stream, and counts its silence from the resume."""

    __slots__ = ("ex", "ctx", "now")

    def __init__(self, ex: Exchange, ctx: RequestContext, now) -> None:
        self.ex, self.ctx, self.now = ex, ctx, now

    def pause(self) -> None:
        self.ex.pause()

    def resume(self) -> None:
        self.ex.resume()
        if self.ctx.last_event_at is not None:
            self.ctx.last_event_at = self.now()

    def abort(self) -> None:
        """Drop the engine connection (an ejected replica, a frozen stream: ``Pipeline._drop_engine``)."""
        self.ex.abort()


def _finish_locally(ctx: RequestContext) -> bool:
    """The engine failed after the stream's last token (its finish reason relayed, or the token limit reached):
    end the stream here, as it would have (the finish, usage if asked and not yet sent, ``[DONE]``), without
    asking another replica for nothing.  True if it was."""
    cont = ctx.continuation
    if cont is None or not ctx.bytes_sent or cont.done:
        return False
    rem = cont.remaining
    if cont.finish_reason is None and not (cont.allowed and rem is not None and rem <= 0):
        return False
    ctx.http.send(cont.closing_events(ctx.sched.prompt_tokens if ctx.sched is not None else None))
    ctx.http.end_stream()
    return True


class Forward:
    name = "forward"

    def __init__(self, fleet: Fleet, metrics: GatewayMetrics, clock: Clock, max_event_bytes: int = DEFAULTS.gateway.max_sse_event_bytes,
                 tracer: PassThrough | OtlpTracer | None = None) -> None:
        self.fleet = fleet
        self.tracer = tracer if tracer is not None else PassThrough()
        self._inputs = self.tracer.exporting  # the engine's prompt count read for the trace only (streams: usage)
        self.metrics = metrics
        self.clock = clock
        self.max_event_bytes = max_event_bytes
        # once the request is on its way: the prefix index learns what was dispatched (Accounting.dispatched)
        self._sent = fleet.prefix.flush if fleet.prefix is not None else None
        self.migrations = CounterFamily("steersman:stream_migrations", "Streams continued on another replica after their engine failed mid-stream.", ["model"])
        metrics.registry.register(self.migrations)

    async def run(self, ctx: RequestContext) -> Outcome:
        index = ctx.replica
        assert index is not None
        rep = self.fleet.replicas[index]
        cont = ctx.continuation
        resuming = cont is not None and ctx.bytes_sent
        body = ctx.body
        if resuming:
            assert cont is not None
            if _finish_locally(ctx):  # the engine died after its last token
                return RESPONDED
            if not cont.allowed:
                return Fail(_no_continuation(cont.reason), Retry.NEVER)
            body = cont.request_body()
        if rep.priority_scheduling and ctx.started_at is not None:
            body = with_priority(body, ctx.started_at.engine_priority)
        tracer = self.tracer
        headers = b"X-Request-Id: %b\r\n%b" % (ctx.request_id.encode(), tracer.attempt(ctx, rep.name))
        if not tracer.exporting:
            return await self._exchange(ctx, rep, index, body, resuming, headers)
        try:
            out = await self._exchange(ctx, rep, index, body, resuming, headers)
        except BaseException:  # cancelled: the client left, the deadline passed, the replica was taken out
            tracer.attempt_ended(ctx, "abandoned")
            raise
        failed = isinstance(out, Fail)
        tracer.attempt_ended(ctx, "ok" if isinstance(out, Respond) else
                             f"failed: {out.error.code or out.error.status}" if failed else "other",
                             out.error.message[:300] if failed else None)
        return out

    async def _exchange(self, ctx: RequestContext, rep, index: int, body: bytes, resuming: bool,
                        headers: bytes) -> Outcome:
        """One upstream exchange with ``rep``: send, then relay (or read whole) its answer."""
        cont = ctx.continuation
        ex: Exchange | None = None
        try:
            try:
                ex = await rep.adapter.send(rep.address, ctx.path, body, self._sent, headers)
            except UpstreamError as e:
                self.metrics.upstream_error(rep.name, "send" if e.connected else "connect")
                if not e.connected:
                    self.fleet.set_healthy(index, False, active=False)  # passive detection; the scraper restores it
                retry = Retry.CONTINUE_ONLY if resuming else Retry.SAFE
                return Fail(upstream_failed(f"Engine {rep.name} is unreachable: {e}", 502), retry)
            if ex.status != 200:
                return await self._engine_error(ctx, rep.name, ex, resuming)
            if not ctx.stream:
                return await self._whole(ctx, ex)
            if not resuming:
                assert ctx.request is not None
                exact = rep.engine == "engine-sim" and ctx.sched is not None  # the gateway tokenizes like engine-sim
                cont = ctx.continuation = Continuation(ctx.request, ctx.body, ctx.sched.prompt_tokens if exact else None)
            else:
                self.migrations.inc(ctx.model)
            assert cont is not None
            cont.begin_leg()
            ctx.last_event_at = self.clock.now()  # a resumed leg's prefill counts towards the idle timeout
            relay = _Relay(ctx, self.fleet, self.clock, self.metrics, cont, resuming, self.max_event_bytes, ex)
            try:
                out = await self._relay(ctx, ex, relay, rep.name)
            finally:
                ctx.output_tokens = cont.output_tokens()
                if relay.last is not None:
                    cont.last_sent = relay.last  # a next leg's first event times its gap from it
            # a broken or malformed end after the stream's last token: closed here, not continued elsewhere
            return RESPONDED if isinstance(out, Fail) and _finish_locally(ctx) else out
        except UpstreamError as e:
            self.metrics.upstream_error(rep.name, "broken")
            if _finish_locally(ctx):
                return RESPONDED
            retry = Retry.CONTINUE_ONLY if ctx.bytes_sent else Retry.SAFE
            return Fail(_mid_stream(ctx, upstream_failed(f"Engine {rep.name} failed mid-response: {e}", 502)), retry)
        finally:
            if ex is not None:
                ex.release()  # aborts it unless the response completed; frees the relay (no reference cycle)
                p = getattr(ctx.http, "producer", None)
                if p is not None and p.ex is ex:
                    ctx.http.producer = None

    async def _whole(self, ctx: RequestContext, ex: Exchange) -> Outcome:
        body = await ex.read()
        if ctx.ticket is not None:
            self.fleet.first_token(ctx.ticket)
        ctx.output_tokens = _usage_int(body, b'"completion_tokens":') or 0
        ctx.cached_tokens = _usage_int(body, b'"cached_tokens":')
        if self._inputs:
            ctx.input_tokens = _usage_int(body, b'"prompt_tokens":')
        ctx.status = 200
        ctx.http.respond(200, body)
        return RESPONDED

    async def _engine_error(self, ctx: RequestContext, name: str, ex: Exchange, resuming: bool) -> Outcome:
        body = await ex.read()
        detail = body[:300].decode("utf-8", "replace")
        refused = refused_with_5xx(ex.status, body)  # relayed as the 400 it is, not retried elsewhere
        status = 400 if refused else ex.status
        if status >= 500:
            self.metrics.upstream_error(name, f"http_{ex.status}")
            retry = Retry.CONTINUE_ONLY if resuming else Retry.SAFE
            return Fail(upstream_failed(f"Engine {name} answered {ex.status}: {detail}", 502), retry)
        if resuming:  # the stream has started: an engine refusing the continuation ends it with an error event
            return Fail(upstream_failed(f"Engine {name} refused to continue the stream ({ex.status}): {detail}", 502), Retry.NEVER)
        if ctx.http.started:  # an earlier attempt began the stream (no event yet): the refusal becomes an error event
            return Fail(ApiError(status, f"Engine {name} refused the request: {detail}", "invalid_request_error",
                                 None, "engine_refused"), Retry.NEVER)
        # the engine refused the request itself (e.g. context too long): relay its error, in OpenAI's format
        ctx.status = status
        field = PROMPT_FIELD.get(ctx.sched.kind if ctx.sched is not None else ctx.kind, "prompt")
        after = ex.headers.get("retry-after", "").strip() if status == 429 else ""  # the engine's own, relayed
        extra = b"Retry-After: %b\r\n" % after.encode() if after.isdigit() and len(after) < 10 else b""
        ctx.http.respond(status, engine_error_body(ex.status, body, field), b"application/json", extra)
        return RESPONDED

    async def _relay(self, ctx: RequestContext, ex: Exchange, relay: _Relay, name: str) -> Outcome:
        req = ctx.http
        if not req.started:
            req.start_stream(200, b"text/event-stream", b"X-Accel-Buffering: no\r\n", hold=True)
        ctx.status = 200
        req.producer = producer = _Producer(ex, ctx, self.clock.now)
        if req.client_paused:  # a continuation leg under a client that cannot keep up: read only once it can
            producer.pause()
        ex.pipe(relay)
        try:
            await ex.done()
        except UpstreamError:
            # an engine breaking after its [DONE] (before the response's last bytes) broke nothing the client needs
            if relay.error is None and not relay.cont.done:
                raise
        cont = relay.cont
        if relay.error is None and not cont.done:
            try:
                relay.events(relay.parser.close())
            except SseError as e:
                relay.error = f"malformed event stream: {e}"
        if relay.error is not None:
            self.metrics.upstream_error(name, "malformed")
            err = upstream_failed(f"Engine {name} sent a malformed stream: {relay.error}", 502, "malformed_stream")
            return Fail(_mid_stream(ctx, err), Retry.CONTINUE_ONLY if ctx.bytes_sent else Retry.SAFE)
        if not cont.done:
            err = ApiError(502, f"Engine {name} ended the stream without finishing it.", "server_error", None, "incomplete_stream")
            return Fail(_mid_stream(ctx, err), Retry.CONTINUE_ONLY if ctx.bytes_sent else Retry.SAFE)
        if cont.usage is not None and not relay.resumed:
            ctx.cached_tokens = _cached(cont.usage)
        req.end_stream()
        return RESPONDED


def _mid_stream(ctx: RequestContext, err: ApiError) -> ApiError:
    """Say in the error why a started stream will not be continued, when it cannot be."""
    cont = ctx.continuation
    if ctx.bytes_sent and cont is not None and not cont.allowed:
        return ApiError(err.status, f"{err.message} The stream cannot be continued on another replica ({cont.reason}).",
                        err.type, err.param, err.code)
    return err


def _no_continuation(reason: str | None) -> ApiError:
    return ApiError(502, f"The engine failed mid-stream and this stream cannot be continued on another replica ({reason}).",
                    "server_error", None, "stream_interrupted")


def _cached(usage: object) -> int | None:
    if isinstance(usage, dict):
        d = usage.get("prompt_tokens_details")
        if isinstance(d, dict) and isinstance(d.get("cached_tokens"), int):
            return d["cached_tokens"]
    return None


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


def with_priority(body: bytes, priority: int) -> bytes:
    """The JSON object ``body`` with ``"priority": priority`` as its last member (for an engine with priority
    scheduling: vLLM reads the last of duplicate keys, so the gateway's value wins over one the client sent)."""
    return with_member(body, b"priority", b"%d" % priority)


def with_model(body: bytes, model: str) -> bytes:
    """The JSON object ``body`` with ``"model": model`` as its last member (brown-out's move to a cheaper model:
    the engines' parsers, vLLM's and msgspec's, take the last of duplicate keys, as for :func:`with_priority`)."""
    return with_member(body, b"model", msgspec.json.encode(model))
