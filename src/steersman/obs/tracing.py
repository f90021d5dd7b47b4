"""Request ids and W3C trace context through the gateway's hop; optional OTLP export of its spans.

Every answer of the gateway's API carries ``X-Request-Id`` (the client's, when it sent a valid one, else a
new 32-hex id), and every upstream attempt sends it to the engine, so one id finds the request in the gateway's
and the engine's logs.

Trace context (https://www.w3.org/TR/trace-context/):

* **Export off** (default, :class:`PassThrough`): the client's ``traceparent`` / ``tracestate`` go to the engine
  unchanged, so an engine that traces (vLLM with ``--otlp-traces-endpoint``) puts its spans under the caller's.
* **Export on** (``gateway.otlp_traces_endpoint``, :class:`OtlpTracer`): the gateway records a SERVER span per
  request (a child of the client's ``traceparent``, or a new trace) and a CLIENT span per upstream attempt
  (replica, outcome: a retried or continued request shows each engine it went to), sends each attempt's own
  ``traceparent`` to its engine, and exports them over OTLP/HTTP with the OpenTelemetry SDK's batch processor
  (a background thread; nothing is written on the request path but the spans' start and end).  Attributes follow
  OpenTelemetry's GenAI conventions (``gen_ai.operation.name``; ``gen_ai.request.model`` the model asked for,
  ``gen_ai.response.model`` the one that answered: brown-out may move a request to a cheaper one;
  ``gen_ai.usage.*`` the engine's usage, the gateway's prompt count when it reported none) plus ``steersman.*``.
  A Responses call sent again shorter (``truncation: auto``) is one SERVER span over its tries
  (:class:`CallSpan`).  Shutdown exports what is buffered for at most ``gateway.otlp_shutdown_timeout_s``.
"""

from __future__ import annotations

import random
import re
import threading
from typing import Any

from steersman.config import DEFAULTS

__all__ = ["request_id", "valid_traceparent", "PassThrough", "OtlpSpans", "OtlpTracer", "CallSpan", "make_tracer"]

#: ``gen_ai.operation.name`` by the request path's kind (OpenTelemetry's GenAI values)
_OPERATION = {"chat": "chat", "completion": "text_completion", "embedding": "embeddings"}

_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # visible ASCII, no spaces: safe to log and to echo in a header
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_getrandbits = random.getrandbits


def request_id(given: str | None) -> str:
    """The client's ``X-Request-Id`` when it is 1-128 visible ASCII characters, else a new random 32-hex id."""
    if given is not None and _REQUEST_ID.fullmatch(given):
        return given
    return f"{_getrandbits(128):032x}"


def valid_traceparent(value: str | None) -> bool:
    """A ``traceparent`` header the W3C spec lets a receiver use: version ``00`` exactly as specified (a later
    version may append fields), never ``ff``, trace and parent ids not all zeros."""
    if not value:
        return False
    m = _TRACEPARENT.fullmatch(value.strip())
    if m is None:
        return False
    version, trace, parent, _, rest = m.groups()
    if version == "ff" or (version == "00" and rest):
        return False
    return trace != "0" * 32 and parent != "0" * 16


class PassThrough:
    """No spans of its own: the client's trace context goes to the engine as it came."""

    exporting = False

    def begin(self, ctx: Any, headers: dict[str, str], method: str, path: str) -> None:
        parent = headers.get("traceparent")
        if valid_traceparent(parent):
            state = headers.get("tracestate")
            ctx.trace = (f"traceparent: {parent.strip()}\r\n"
                         + (f"tracestate: {state.strip()}\r\n" if state and state.isascii() and state.isprintable()
                            else "")).encode()

    def attempt(self, ctx: Any, replica: str) -> bytes:
        """Header lines for an upstream attempt (each ending in CRLF)."""
        return ctx.trace or b""

    def attempt_ended(self, ctx: Any, outcome: str, why: str | None = None) -> None:
        pass

    def end(self, ctx: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass


class OtlpSpans:
    """An OpenTelemetry tracer of its own (not the process-global provider: a library must not take over its host's
    tracing) exporting over OTLP/HTTP (protobuf) to ``endpoint`` (``http://host:4318/v1/traces``) from the SDK's
    batch processor thread."""

    def __init__(self, endpoint: str, service_name: str, sample_ratio: float = 1.0,
                 shutdown_timeout_s: float = DEFAULTS.gateway.otlp_shutdown_timeout_s) -> None:
        self.shutdown_timeout_s = shutdown_timeout_s
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.trace = trace
        self.kind = trace.SpanKind
        self.propagator = TraceContextTextMapPropagator()
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                                       sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
        self.exporter = OTLPSpanExporter(endpoint=endpoint)
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer(f"steersman.{service_name}")

    def parent(self, headers: dict[str, str]) -> Any:
        """The context a valid ``traceparent`` (and its ``tracestate``) in ``headers`` names, else None."""
        carrier = {k: headers[k] for k in ("traceparent", "tracestate") if k in headers}
        return self.propagator.extract(carrier) if valid_traceparent(carrier.get("traceparent")) else None

    def error(self, span: Any, description: str) -> None:
        span.set_status(self.trace.Status(self.trace.StatusCode.ERROR, description))

    def shutdown(self) -> None:
        """Export what is buffered, then stop the exporter's thread, within ``shutdown_timeout_s`` in all: most of it
        for the export, then the exporter is shut down (its retries end; what is left is dropped) and the SDK's
        thread given the rest.  That thread is a daemon: one still inside a POST the collector never answers is left
        behind, not waited for (an observability audit: the second wait ran its whole 2 s against such a collector,
        4 s in all, where the setting promises 2)."""
        timeout_s = self.shutdown_timeout_s
        done = threading.Thread(target=self.provider.shutdown, name="otlp-shutdown", daemon=True)
        done.start()
        done.join(0.8 * timeout_s)
        if done.is_alive():
            self.exporter.shutdown()
            done.join(0.2 * timeout_s)


class CallSpan:
    """One SERVER span over a Responses call's passes through the request path: a try refused for the context's
    length and held (``ResponsesHttp.held``: sent again shorter) is no answer the client saw, so it neither begins
    nor ends a span of its own; the try that answers ends the call's span, with the tries and all their upstream
    attempts counted on it (its CLIENT spans are all children of it)."""

    __slots__ = ("span", "tries", "attempts")

    def __init__(self) -> None:
        self.span: Any = None
        self.tries = 0
        self.attempts = 0  # upstream attempts of the held tries


class OtlpTracer:
    """The gateway's spans, exported (see the module's docstring)."""

    exporting = True

    def __init__(self, endpoint: str, sample_ratio: float, shutdown_timeout_s: float) -> None:
        self.spans = sp = OtlpSpans(endpoint, "steersman", sample_ratio, shutdown_timeout_s)
        self._trace, self._kind, self._propagator, self.tracer = sp.trace, sp.kind, sp.propagator, sp.tracer

    def begin(self, ctx: Any, headers: dict[str, str], method: str, path: str) -> None:
        call = getattr(ctx.http, "call_span", None)
        if call is not None:
            call.tries += 1
            if call.span is not None:  # a Responses call's next try: its span goes on
                ctx.trace = call.span
                return
        span = self.tracer.start_span(f"{method} {path}", context=self.spans.parent(headers), kind=self._kind.SERVER,
                                      attributes={
            "http.request.method": method, "url.path": path, "steersman.request_id": ctx.request_id})
        ctx.trace = span
        if call is not None:
            call.span = span

    def attempt(self, ctx: Any, replica: str) -> bytes:
        server = ctx.trace
        if server is None:
            return b""
        span = self.tracer.start_span(f"upstream {replica}", context=self._trace.set_span_in_context(server),
                                      kind=self._kind.CLIENT,
                                      attributes={"steersman.replica": replica, "steersman.attempt": ctx.attempts})
        ctx.attempt_span = span
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return "".join(f"{k}: {v}\r\n" for k, v in carrier.items()).encode()

    def attempt_ended(self, ctx: Any, outcome: str, why: str | None = None) -> None:
        """``outcome``: ``ok``, ``failed: <code>``, ``abandoned``; ``why``: a failure's own words (the engine's
        status and answer, a refused or broken connection), on the span as ``steersman.error`` and its status
        (an observability audit: a 503, a reset mid-stream and an unreachable engine all read ``failed:
        upstream_error``, no reason why the request left the replica)."""
        span, ctx.attempt_span = ctx.attempt_span, None
        if span is not None:
            span.set_attribute("steersman.outcome", outcome)
            if why:
                span.set_attribute("steersman.error", why)
            if outcome != "ok":
                self.spans.error(span, f"{outcome}: {why}" if why else outcome)
            span.end()

    def end(self, ctx: Any) -> None:
        span, ctx.trace = ctx.trace, None
        if span is None:
            return
        self.attempt_ended(ctx, "abandoned")  # an attempt cut short (the client left, the deadline passed)
        attempts = ctx.attempts
        call = getattr(ctx.http, "call_span", None)
        if call is not None:
            if ctx.http.held is not None:  # held, to be sent again shorter: the call's span waits for the answer
                call.attempts += attempts
                return
            attempts += call.attempts
        attrs: dict[str, Any] = {"http.response.status_code": ctx.status, "gen_ai.request.model": ctx.requested_model,
                                 "gen_ai.operation.name": _OPERATION.get(ctx.kind, ctx.kind),
                                 "gen_ai.usage.output_tokens": ctx.output_tokens, "steersman.attempts": attempts}
        if ctx.status == 200:
            attrs["gen_ai.response.model"] = ctx.model
        inputs = _input_tokens(ctx)
        if inputs is not None:
            attrs["gen_ai.usage.input_tokens"] = inputs
        if call is not None:
            attrs["steersman.responses.tries"] = call.tries
        if ctx.tenant is not None:
            attrs["steersman.tenant"] = ctx.tenant.name
        if ctx.cached_tokens is not None:
            attrs["steersman.cached_tokens"] = ctx.cached_tokens
        span.set_attributes(attrs)
        if ctx.status >= 500 or ctx.status == 0 or ctx.failed:
            self.spans.error(span, "ended with an error event" if ctx.failed else f"status {ctx.status}")
        span.end()

    def shutdown(self) -> None:
        self.spans.shutdown()


def _input_tokens(ctx: Any) -> int | None:
    """The prompt's tokens as the engine counted them (its usage: a whole answer's, or the stream's first leg's
    when it sent usage), else the gateway's own count (an estimate for an engine that tokenizes otherwise)."""
    n = ctx.input_tokens
    if n is None:
        cont = ctx.continuation
        usage = cont.usage if cont is not None else None
        n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    return ctx.sched.prompt_tokens if ctx.sched is not None else None


def make_tracer(endpoint: str | None, sample_ratio: float, shutdown_timeout_s: float) -> PassThrough | OtlpTracer:
    return OtlpTracer(endpoint, sample_ratio, shutdown_timeout_s) if endpoint else PassThrough()
