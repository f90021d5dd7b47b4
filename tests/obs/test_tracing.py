"""Request ids and traces end to end: the official client -> the gateway -> each engine it tried, as one trace
(W3C traceparent in, OTLP/HTTP out, received here by a real OTLP endpoint on 127.0.0.1)."""

import gzip
import http.server
import threading
from dataclasses import replace

import pytest

from steersman.enginesim.app import SimServerConfig
from steersman.enginesim.faults import FaultSpec
from steersman.obs.tracing import request_id, valid_traceparent
from steersman.testing import LiveFleet

TRACE, PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
MSGS = [{"role": "user", "content": "Trace me."}]


class Otlp:
    """An OTLP/HTTP traces endpoint: decodes every ExportTraceServiceRequest it is sent."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest, ExportTraceServiceResponse)

        spans = self.spans = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                for rs in req.resource_spans:
                    service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
                    for ss in rs.scope_spans:
                        for sp in ss.spans:
                            attrs = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in sp.attributes}
                            spans.append({"service": service, "name": sp.name, "trace": sp.trace_id.hex(),
                                          "id": sp.span_id.hex(), "parent": sp.parent_span_id.hex(),
                                          "kind": sp.kind, "attrs": attrs, "error": sp.status.code == 2})
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def otlp():
    o = Otlp()
    yield o
    o.close()


def test_request_ids_and_traceparents_are_checked_as_the_specs_say():
    assert request_id("req-42") == "req-42"
    for bad in ("", "has space", "x" * 129, "naïve", None):
        new = request_id(bad)
        assert len(new) == 32 and int(new, 16) >= 0 and new != request_id(bad)
    ok = f"00-{TRACE}-{PARENT}-01"
    assert valid_traceparent(ok) and valid_traceparent(f"cc-{TRACE}-{PARENT}-01-what-the-future-adds")
    for bad in (f"00-{TRACE}-{PARENT}-01-extra", f"ff-{TRACE}-{PARENT}-01", f"00-{'0' * 32}-{PARENT}-01",
                f"00-{TRACE}-{'0' * 16}-01", f"00-{TRACE.upper()}-{PARENT}-01", f"00-{TRACE}-{PARENT}", "", None):
        assert not valid_traceparent(bad), bad


def _engines(otlp_url, faulty: bool = True):
    a = b = SimServerConfig(gpu="H100", model="llama-3.1-8b", speedup=50.0, port=0)
    return [replace(a, otlp_traces_endpoint=otlp_url),
            replace(b, otlp_traces_endpoint=otlp_url, faults=FaultSpec(error_rate=1.0) if faulty else FaultSpec())]


def test_one_trace_runs_from_the_client_through_the_gateway_to_every_engine_it_tried(otlp):
    from openai import OpenAI

    with LiveFleet(sims=_engines(otlp.url), policy="round-robin", gateway={"otlp_traces_endpoint": otlp.url}) as lf:
        with OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0) as client:
            for i in range(4):
                raw = client.chat.completions.with_raw_response.create(
                    model="llama-3.1-8b", messages=MSGS, max_tokens=4, stream=i % 2 == 1,
                    extra_headers={"traceparent": f"00-{TRACE}-{PARENT}-01", "x-request-id": f"req-{i}"})
                assert raw.headers["x-request-id"] == f"req-{i}"
                if i % 2 == 0:  # the engine names the answer by the id (as vLLM's _base_request_id does)
                    assert raw.parse().id == f"chatcmpl-req-{i}"
                else:  # read the stream to its end: a client that leaves before it is a 499 (a race on a busy VM)
                    assert sum(len(c.choices) for c in raw.parse()) >= 1
    spans = otlp.spans
    servers = [s for s in spans if s["service"] == "steersman" and s["kind"] == 2]
    attempts = {s["id"]: s for s in spans if s["service"] == "steersman" and s["kind"] == 3}
    engines = [s for s in spans if s["service"] == "engine-sim"]
    assert len(servers) == 4 and {s["attrs"]["steersman.request_id"] for s in servers} == {f"req-{i}" for i in range(4)}
    for s in servers:  # under the client's span, in the client's trace
        assert s["trace"] == TRACE and s["parent"] == PARENT and not s["error"]
        assert s["attrs"]["http.response.status_code"] == 200 and s["attrs"]["gen_ai.request.model"] == "llama-3.1-8b"
        assert s["attrs"]["gen_ai.usage.output_tokens"] == 4 and s["attrs"]["gen_ai.usage.input_tokens"] > 0
        mine = [a for a in attempts.values() if a["parent"] == s["id"]]
        assert len(mine) == s["attrs"]["steersman.attempts"] >= 1
        assert [a["attrs"]["steersman.outcome"] for a in mine][-1] == "ok"
    retried = [a for a in attempts.values() if a["attrs"]["steersman.outcome"] != "ok"]
    assert retried and all(a["attrs"]["steersman.replica"] == "sim-1" and a["error"] for a in retried)
    # and why it left that replica: the engine's own answer (an audit found every failure read "upstream_error")
    assert all("answered 500" in a["attrs"]["steersman.error"] for a in retried), [a["attrs"] for a in retried]
    # every attempt reached an engine, which traced it under the attempt's own span (its traceparent)
    assert sorted(e["parent"] for e in engines) == sorted(attempts)
    assert all(e["trace"] == TRACE and e["name"] == "llm_request" for e in engines)
    # each names the response it made from the request's id (chatcmpl-<X-Request-Id>), as vLLM's span does
    named = {e["attrs"]["gen_ai.request.id"] for e in engines if not e["error"]}
    assert named == {f"chatcmpl-req-{i}" for i in range(4)}
    assert sum(e["error"] for e in engines) == len(retried)  # the failing engine's spans say so


def test_without_export_the_clients_trace_context_reaches_the_engine_unchanged(otlp):
    import httpx

    with LiveFleet(sims=_engines(otlp.url, faulty=False), policy="round-robin") as lf:
        for i in range(2):
            r = httpx.post(lf.url + "/v1/chat/completions", headers={"traceparent": f"00-{TRACE}-{PARENT}-01"},
                           json={"model": "llama-3.1-8b", "messages": MSGS, "max_tokens": 2})
            assert r.status_code == 200 and len(r.headers["x-request-id"]) == 32  # one was made for it
            assert r.json()["id"] == "chatcmpl-" + r.headers["x-request-id"]
        r = httpx.post(lf.url + "/v1/chat/completions", json={"model": "nope", "messages": MSGS},
                       headers={"x-request-id": "bad id"})
        assert r.status_code == 404 and len(r.headers["x-request-id"]) == 32  # errors carry one too
    engines = [s for s in otlp.spans if s["service"] == "engine-sim"]
    assert len(engines) == 2 and all(e["trace"] == TRACE and e["parent"] == PARENT for e in engines)
    assert not [s for s in otlp.spans if s["service"] == "steersman"]


def test_a_client_trace_not_sampled_is_not_exported(otlp):
    import httpx

    with LiveFleet(sims=_engines(otlp.url, faulty=False)[:1], gateway={"otlp_traces_endpoint": otlp.url}) as lf:
        r = httpx.post(lf.url + "/v1/chat/completions", headers={"traceparent": f"00-{TRACE}-{PARENT}-00"},
                       json={"model": "llama-3.1-8b", "messages": MSGS, "max_tokens": 2})
        assert r.status_code == 200
        r = httpx.post(lf.url + "/v1/chat/completions", json={"model": "llama-3.1-8b", "messages": MSGS, "max_tokens": 2})
        assert r.status_code == 200
    roots = [s for s in otlp.spans if s["service"] == "steersman" and s["kind"] == 2]
    assert len(roots) == 1 and roots[0]["parent"] == "" and roots[0]["trace"] != TRACE  # a trace of its own


def _servers(otlp):
    return [s for s in otlp.spans if s["service"] == "steersman" and s["kind"] == 2]


def test_a_span_names_its_operation_and_counts_the_engines_prompt_tokens(otlp):
    """``gen_ai.operation.name`` by endpoint; ``gen_ai.usage.input_tokens`` as the engine counted the prompt (a
    scripted engine reports 1 for any prompt), whole or streamed with usage, not the gateway's own estimate."""
    from openai import OpenAI

    from steersman.testing.scripted import Script

    with LiveFleet(scripted=[Script()], gateway={"otlp_traces_endpoint": otlp.url}) as lf:
        with OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0) as client:
            long = [{"role": "user", "content": "word " * 200}]
            r = client.chat.completions.create(model="scripted", messages=long, max_tokens=8,
                                               extra_headers={"x-request-id": "whole"})
            assert r.usage.prompt_tokens == 1
            s = client.chat.completions.create(model="scripted", messages=long, max_tokens=8, stream=True,
                                               stream_options={"include_usage": True},
                                               extra_headers={"x-request-id": "streamed"})
            assert [c.usage.prompt_tokens for c in s if c.usage] == [1]
            client.completions.create(model="scripted", prompt="word " * 200, max_tokens=8,
                                      extra_headers={"x-request-id": "text"})
    spans = {s["attrs"]["steersman.request_id"]: s["attrs"] for s in _servers(otlp)}
    assert {k: a["gen_ai.operation.name"] for k, a in spans.items()} == {
        "whole": "chat", "streamed": "chat", "text": "text_completion"}
    assert all(a["gen_ai.usage.input_tokens"] == 1 for a in spans.values()), spans
    assert all(a["gen_ai.request.model"] == a["gen_ai.response.model"] == "scripted" for a in spans.values())


def test_an_embeddings_span_is_named_so(otlp):
    import httpx

    with LiveFleet(sims=_engines(otlp.url, faulty=False)[:1], gateway={"otlp_traces_endpoint": otlp.url}) as lf:
        r = httpx.post(lf.url + "/v1/embeddings", json={"model": "llama-3.1-8b", "input": "Trace me."})
        assert r.status_code == 200
    (span,) = _servers(otlp)
    assert span["attrs"]["gen_ai.operation.name"] == "embeddings"
    assert span["attrs"]["gen_ai.usage.input_tokens"] == r.json()["usage"]["prompt_tokens"]


def test_a_browned_out_request_traces_the_model_asked_for_and_the_one_that_answered(otlp):
    """Brown-out moved a sheddable request to the cheaper model: ``gen_ai.request.model`` is the model the client
    asked for (it said the substitute), ``gen_ai.response.model`` the one that answered."""
    import threading
    import time

    import httpx

    from steersman.config import EngineSettings
    from steersman.control import generate_key

    big, small = "llama-3.1-8b", "qwen2.5-7b"
    key, digest = generate_key()
    extra = {"tenants": {"cheap": {"priority": "sheddable"}}, "api_keys": [{"sha256": digest, "tenant": "cheap"}],
             "reliability": {"brownout_queue_depth": 1, "brownout_models": {big: small},
                             "limit_initial": 1, "limit_min": 1, "limit_max": 1}}
    sims = [SimServerConfig(speedup=10.0, port=0, engine=EngineSettings(max_num_seqs=1)),
            SimServerConfig(model=small, speedup=10.0, port=0)]

    def post(text, **headers):
        return httpx.post(lf.url + "/v1/chat/completions", timeout=30, headers={"Authorization": f"Bearer {key}", **headers},
                          json={"model": big, "max_tokens": 4, "messages": [{"role": "user", "content": text}]})

    def until(cond):
        t0 = time.monotonic()
        while not cond():
            assert time.monotonic() - t0 < 10
            time.sleep(0.01)

    with LiveFleet(sims=sims, extra=extra, gateway={"otlp_traces_endpoint": otlp.url}) as lf:
        assert httpx.post(lf.sims[0].url + "/admin/faults", json={"hang": True}).status_code == 200
        waiting = [threading.Thread(target=post, args=(t,)) for t in ("in the engine", "in the queue")]
        waiting[0].start()
        until(lambda: lf.gateway.fleet.snapshot().in_flight[0] >= 1)
        waiting[1].start()
        until(lambda: lf.gateway.plane.waiting_for(big) >= 1)
        r = post("moved", **{"x-request-id": "moved"})
        assert r.status_code == 200 and r.json()["model"] == small
        assert httpx.delete(lf.sims[0].url + "/admin/faults").status_code == 200
        for th in waiting:
            th.join(30)
    attrs = next(s["attrs"] for s in _servers(otlp) if s["attrs"]["steersman.request_id"] == "moved")
    assert attrs["gen_ai.request.model"] == big and attrs["gen_ai.response.model"] == small


def test_a_responses_call_sent_again_shorter_is_one_server_span(otlp):
    """``truncation: auto`` over the context: the tries refused for its length and held are no answers; one
    SERVER span for the client's one request (it was one per try, 400s included), all the tries' upstream
    attempts under it."""
    import httpx

    from steersman.config import EngineSettings

    sim = SimServerConfig(speedup=50.0, port=0, engine=EngineSettings(max_model_len=300))
    turns = []
    for i in range(6):
        turns += [{"role": "user", "content": f"turn {i}: " + "word " * 120}, {"role": "assistant", "content": "ok"}]
    turns.append({"role": "user", "content": "last question"})
    with LiveFleet(sims=[sim], gateway={"otlp_traces_endpoint": otlp.url}) as lf:
        r = httpx.post(lf.url + "/v1/responses", timeout=30, headers={"traceparent": f"00-{TRACE}-{PARENT}-01"},
                       json={"model": "llama-3.1-8b", "input": turns, "truncation": "auto", "max_output_tokens": 4})
        assert r.status_code == 200, r.text
    (server,) = _servers(otlp)
    a = server["attrs"]
    assert server["parent"] == PARENT and a["http.response.status_code"] == 200 and not server["error"]
    assert a["steersman.responses.tries"] > 1
    attempts = [s for s in otlp.spans if s["service"] == "steersman" and s["kind"] == 3]
    assert all(s["parent"] == server["id"] for s in attempts) and len(attempts) == a["steersman.attempts"]


def test_shutdown_is_bounded_when_the_otlp_endpoint_is_down():
    """Nothing listens at the endpoint: the SDK's shutdown waited up to 30 s for batches it retried for 10 s each."""
    import socket
    import time
    import types

    from steersman.obs.tracing import OtlpTracer

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    from steersman.config import DEFAULTS

    tracer = OtlpTracer(f"http://127.0.0.1:{port}/v1/traces", 1.0, DEFAULTS.gateway.otlp_shutdown_timeout_s)
    for i in range(3000):  # several of the processor's 512-span batches
        ctx = types.SimpleNamespace(request_id=f"r{i}", trace=None, attempt_span=None, attempts=1, status=200,
                                    model="m", requested_model="m", kind="chat", output_tokens=3, sched=None,
                                    tenant=None, cached_tokens=None, input_tokens=None, continuation=None,
                                    failed=False, http=None)
        tracer.begin(ctx, {}, "POST", "/v1/chat/completions")
        tracer.attempt(ctx, "sim-0")
        tracer.attempt_ended(ctx, "ok")
        tracer.end(ctx)
    t0 = time.monotonic()
    tracer.shutdown()
    assert time.monotonic() - t0 < 3.0  # gateway.otlp_shutdown_timeout_s: 2 s in all


def test_shutdown_is_bounded_when_the_collector_accepts_and_never_answers():
    """An observability audit: a collector that accepts connections and never answers held the shutdown 4 s (the
    export's 2 s, then as long again for the SDK's thread inside its POST), the setting says 2."""
    import socket
    import time
    import types

    from steersman.config import DEFAULTS
    from steersman.obs.tracing import OtlpTracer

    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(16)  # accepted by the kernel, never read or answered
    try:
        timeout = DEFAULTS.gateway.otlp_shutdown_timeout_s
        tracer = OtlpTracer(f"http://127.0.0.1:{mute.getsockname()[1]}/v1/traces", 1.0, timeout)
        for i in range(600):
            ctx = types.SimpleNamespace(request_id=f"r{i}", trace=None, attempt_span=None, attempts=1, status=200,
                                        model="m", requested_model="m", kind="chat", output_tokens=3, sched=None,
                                        tenant=None, cached_tokens=None, input_tokens=None, continuation=None,
                                        failed=False, http=None)
            tracer.begin(ctx, {}, "POST", "/v1/chat/completions")
            tracer.end(ctx)
        t0 = time.monotonic()
        tracer.shutdown()
        assert time.monotonic() - t0 < timeout + 0.5
    finally:
        mute.close()


def test_a_tool_call_streams_output_tokens_are_the_engines_usage(otlp):
    """An observability audit: a streamed tool call's SERVER span said 16 output tokens where the engine's usage
    (and the response's) said 15: the relay counted the call's first event (its id and name) as a token, and the
    same count went to the tenant's token refund."""
    from openai import OpenAI

    tools = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    with LiveFleet(sims=_engines(otlp.url, faulty=False)[:1], gateway={"otlp_traces_endpoint": otlp.url}) as lf:
        with OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0) as client:
            usage = None
            for chunk in client.chat.completions.create(model="llama-3.1-8b", messages=MSGS, tools=tools,
                                                        tool_choice="required", stream=True,
                                                        stream_options={"include_usage": True}):
                usage = chunk.usage or usage
    server = [s for s in otlp.spans if s["service"] == "steersman" and s["kind"] == 2]
    assert usage is not None and len(server) == 1
    assert server[0]["attrs"]["gen_ai.usage.output_tokens"] == usage.completion_tokens
