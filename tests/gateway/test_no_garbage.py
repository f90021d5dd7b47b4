"""A served request leaves no reference cycles: its objects are freed as it ends, not by the garbage collector.

Each request's context, relay and upstream exchange once formed a cycle (client request -> producer
exchange -> relay sink -> context -> client request): ~17 objects per request outlived it, and the
collector's passes over them cost ~5% of the gateway's CPU at 64 streams, with pauses up to ~36 ms
that stalled every stream in flight.  A closed client connection did too (connection -> parser ->
connection), once per request for clients that do not keep connections alive, and so did a request
whose client left mid-stream (its cancellation's traceback -> a frame naming the task -> the task).
"""

import gc
import time

import httpx

from steersman.fleet.snapshot import IN_FLIGHT
from steersman.enginesim.faults import FaultSpec
from steersman.http.client import Exchange, UpstreamError, _UpConn
from steersman.http.server import HttpRequest, _Connection
from steersman.pipeline.context import RequestContext
from steersman.pipeline.forward import _Relay
from steersman.testing import LiveFleet
from tests.gateway.conftest import sims
from tests.gc_cycles import cyclic_garbage

_TRACKED = (RequestContext, Exchange, _Relay, HttpRequest, _Connection, _UpConn, UpstreamError)


def _served(fleet, n: int) -> None:
    with httpx.Client(base_url=fleet.url, timeout=30) as c:
        for i in range(n):
            body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": f"cycle check {i}"}],
                    "max_tokens": 8, "stream": i % 2 == 0}
            # every third on a connection of its own (closed after the response)
            headers = {"connection": "close"} if i % 3 == 0 else {}
            r = c.post("/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 200, r.text
        # refused requests too: malformed JSON, an unknown model
        assert c.post("/v1/chat/completions", content=b"{not json").status_code == 400
        r = c.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 404


def _cyclic_garbage() -> dict[str, int]:
    return cyclic_garbage(lambda o: isinstance(o, _TRACKED))


def test_served_requests_leave_no_cyclic_garbage(fleet):
    _served(fleet, 2)  # warm: connections pooled, kernels loaded
    gc.collect()
    _served(fleet, 20)
    _settled(fleet)
    assert _cyclic_garbage() == {}


def _settled(fleet) -> None:
    deadline = time.monotonic() + 5  # the gateway ends a request just after the client has gone or read its last byte
    while fleet.gateway.fleet.live[IN_FLIGHT].sum() > 0 and time.monotonic() < deadline:
        time.sleep(0.01)


def test_clients_leaving_mid_stream_leave_no_cyclic_garbage(fleet):
    # a cancelled request's traceback holds its frames: a frame naming its own task closed a cycle through
    # the task's cancellation (Pipeline._attempt's local), keeping the whole request
    def leave(n: int) -> None:
        with httpx.Client(base_url=fleet.url, timeout=30) as c:
            for i in range(n):
                body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": f"leave {i}"}],
                        "max_tokens": 200, "stream": True}
                with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    assert r.status_code == 200
                    next(r.iter_lines())  # the first event, then the client closes the connection
    leave(2)
    _settled(fleet)
    gc.collect()
    leave(10)
    _settled(fleet)
    assert _cyclic_garbage() == {}


def test_an_engine_dying_mid_stream_leaves_no_cyclic_garbage():
    # the streams it served continue elsewhere; the scraper keeps failing to reach it: each failed connect made
    # a cycle (asyncio.wait_for's task held through its error's traceback; a protocol and its parser)
    with LiveFleet(sims=sims(3), policy="round-robin") as lf:
        _served(lf, 3)
        gc.collect()

        async def die():
            lf.sims[0].faults.apply(FaultSpec(die_after_tokens=3))

        lf.call(die)
        with httpx.Client(base_url=lf.url, timeout=30) as c:
            for i in range(9):
                body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": f"die {i}"}],
                        "max_tokens": 12, "stream": True}
                r = c.post("/v1/chat/completions", json=body)
                assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
        gw = lf.gateway
        for _ in range(3):  # scrapes of the dead replica, as its scraper loop makes every interval
            lf.call(gw.scraper.scrape_once, gw.fleet.replicas[0])
        _settled(lf)
        assert _cyclic_garbage() == {}


def _gc_pauses(fleet, generation: str) -> float:
    text = httpx.get(fleet.url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("steersman:gc_pause_seconds_count{") and f'generation="{generation}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no steersman:gc_pause_seconds series for generation " + generation)


def test_gc_pauses_are_exported_while_the_gateway_runs(fleet):
    # steersman:gc_pause_seconds: every collection in the process is timed, by generation
    before = _gc_pauses(fleet, "2")
    for _ in range(3):
        gc.collect()
    assert _gc_pauses(fleet, "2") >= before + 3
    assert _gc_pauses(fleet, "0") >= 0


def test_a_stopped_gateway_leaves_the_collector_callbacks_as_they_were():
    with LiveFleet(sims=sims(1), policy="least-request") as lf:
        callback = lf.gateway.metrics.gc._callback
        assert callback in gc.callbacks
    assert callback not in gc.callbacks
