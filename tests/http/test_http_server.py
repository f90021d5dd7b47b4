"""The gateway's HTTP/1.1 server over real sockets: framing, limits, keep-alive, cancellation."""

import asyncio

import orjson
import pytest

from steersman.api.errors import error_body
from steersman.http.server import HttpServer


async def _server(max_body: int = 1000, idle: float = 75.0) -> HttpServer:
    srv = HttpServer(error_body, max_body, idle)
    srv.cancelled = 0

    async def echo(req):
        req.respond(200, orjson.dumps({"len": len(req.body), "path": req.path, "query": req.query}))

    async def stream(req):
        req.start_stream()
        for i in range(3):
            req.send(b"data: %d\n\n" % i)
            await asyncio.sleep(0)
        req.end_stream()

    async def slow(req):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            srv.cancelled += 1
            raise

    async def boom(req):
        raise ValueError("bug")

    srv.route("POST", "/echo", echo)
    srv.route("GET", "/stream", stream)
    srv.route("GET", "/slow", slow)
    srv.route("GET", "/boom", boom)
    await srv.start("127.0.0.1", 0)
    return srv


async def _exchange(port: int, raw: bytes, until: bytes | None = None, read_timeout: float = 5.0) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(raw)
    await w.drain()
    out = b""
    try:
        while True:
            chunk = await asyncio.wait_for(r.read(65536), read_timeout)
            if not chunk:
                break
            out += chunk
            if until is not None and out.count(until) >= 1 and out.endswith(until):
                break
    finally:
        w.close()
    return out


async def test_keep_alive_and_pipelining_answer_in_order():
    srv = await _server()
    try:
        req = b"POST /echo?a=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
        req2 = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
        out = await _exchange(srv.port, req + req2 + req, until=b'"query":"a=1"}')
        bodies = [orjson.loads(part.split(b"\r\n\r\n", 1)[1]) for part in out.split(b"HTTP/1.1 ")[1:]]
        assert [b["len"] for b in bodies] == [3, 2, 3] and bodies[0]["query"] == "a=1"
    finally:
        await srv.stop()


async def test_streaming_is_chunked_and_http10_is_close_delimited():
    srv = await _server()
    try:
        out = await _exchange(srv.port, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", until=b"0\r\n\r\n")
        assert b"Transfer-Encoding: chunked" in out and out.endswith(b"0\r\n\r\n") and b"data: 2" in out
        out = await _exchange(srv.port, b"GET /stream HTTP/1.0\r\n\r\n")
        assert b"Transfer-Encoding" not in out and out.endswith(b"data: 2\n\n")
    finally:
        await srv.stop()


@pytest.mark.parametrize(
    "raw,status",
    [
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000, 413),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"3e8\r\n" + b"x" * 1000 + b"\r\n3e8\r\n" + b"x" * 1000 + b"\r\n0\r\n\r\n", 413),
        (b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (b"GET /stream HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * 70000 + b"\r\n\r\n", 431),
        (b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n", 500),
        # RFC 9112 (found by a fuzzing helper, thirty-first session; each was served as HTTP/1.1 before): 3.2, an
        # HTTP/1.1 request without exactly one Host; 6.1, a transfer coding other than chunked (a gzipped body read
        # as plain JSON); a major version other than 1
        (b"GET /echo HTTP/1.1\r\nX: y\r\n\r\n", 400),
        (b"GET /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", 501),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"2\r\nhi\r\n0\r\n\r\n", 501),
        # a singleton Authorization given twice (state audit, thirty-third session): the last line won, so a front
        # proxy reading the first authenticated (and logged) another tenant than the gateway billed
        (b"GET /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-bad\r\nauthorization: Bearer sk-good\r\n\r\n", 400),
        (b"GET /echo HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        (b"GET /echo HTTP/0.9\r\nHost: x\r\n\r\n", 505),
    ],
)
async def test_errors_are_openai_json(raw, status):
    srv = await _server()
    try:
        out = await _exchange(srv.port, raw, until=b"}}")
        head, _, body = out.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d" % status), out[:200]
        err = orjson.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"} and "Traceback" not in err["message"]
    finally:
        await srv.stop()


async def test_a_steersman_header_sent_twice_is_a_400_naming_it():
    """Each of steersman's headers takes one value (scheduling audit, thirty-fourth session: the last line won, a
    deadline of 5000 then 1 ms read as 1 ms; a review: a workflow id given twice, joined, would name a new workflow)."""
    srv = await _server()
    try:
        out = await _exchange(srv.port, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                              b"X-Steersman-Workflow-Id: a\r\nx-steersman-workflow-id: b\r\n\r\n", until=b"}}")
        head, _, body = out.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"x-steersman-workflow-id" in orjson.loads(body)["error"]["message"].encode()
        # the same value twice is the same request
        out = await _exchange(srv.port, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                              b"X-Steersman-Slo: batch\r\nx-steersman-slo: batch\r\n\r\n", until=b"}")
        assert out.startswith(b"HTTP/1.1 200")
    finally:
        await srv.stop()


async def test_expect_100_continue():
    srv = await _server()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", srv.port)
        w.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        assert (await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 100")
        w.write(b"data")
        head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200")
        w.close()
    finally:
        await srv.stop()


async def test_client_disconnect_cancels_the_handler():
    srv = await _server()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", srv.port)
        w.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await w.drain()
        for _ in range(100):
            if srv.connections and any(c._current for c in srv.connections):
                break
            await asyncio.sleep(0.01)
        w.close()
        for _ in range(200):
            if srv.cancelled:
                break
            await asyncio.sleep(0.01)
        assert srv.cancelled == 1
    finally:
        await srv.stop()


async def test_idle_connections_are_closed():
    srv = await _server(idle=0.05)
    try:
        r, w = await asyncio.open_connection("127.0.0.1", srv.port)
        assert await asyncio.wait_for(r.read(), 5) == b""  # server closed it
        w.close()
    finally:
        await srv.stop()


async def test_a_held_stream_head_goes_out_with_the_first_event_and_nothing_follows_the_end():
    srv = HttpServer(error_body, 1000)

    async def held(req):
        req.start_stream(hold=True)
        await asyncio.sleep(0.3)
        req.send(b"data: 1\n\n")
        req.send(b"data: 2\n\n", last=True)
        req.send(b"data: late\n\n")  # after the end: dropped, the kept-alive connection stays clean
        req.end_stream()

    srv.route("GET", "/held", held)
    await srv.start("127.0.0.1", 0)
    try:
        r, w = await asyncio.open_connection("127.0.0.1", srv.port)
        w.write(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(r.read(1), 0.1)  # the head waits for the first event
        out = await asyncio.wait_for(r.readuntil(b"0\r\n\r\n"), 5)
        assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n")
        w.write(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")  # the same connection serves the next request
        out = await asyncio.wait_for(r.readuntil(b"0\r\n\r\n"), 5)
        assert out.startswith(b"HTTP/1.1 200") and b"late" not in out
        w.close()
    finally:
        await srv.stop()


async def test_the_idle_deadline_moves_with_each_request():
    srv = await _server(idle=0.4)
    try:
        r, w = await asyncio.open_connection("127.0.0.1", srv.port)
        for _ in range(4):  # 4 x 0.25 s: past the first idle deadline, open while it is used
            await asyncio.sleep(0.25)
            w.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx")
            assert (await asyncio.wait_for(r.readuntil(b"}"), 5)).startswith(b"HTTP/1.1 200")
        t0 = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(r.read(), 5) == b""  # then idle: closed
        assert 0.3 < asyncio.get_running_loop().time() - t0 < 2.0
        w.close()
    finally:
        await srv.stop()


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_accepted_connections_have_tcp_nodelay(loop_kind):
    """The server leaves TCP_NODELAY to the event loop (uvloop and asyncio set it on every TCP transport):
    a streamed token must not wait for Nagle's algorithm.  If a loop stopped doing so, this fails."""
    import socket

    import uvloop

    seen = []

    async def main():
        srv = await _server()
        r, w = await asyncio.open_connection("127.0.0.1", srv.port)
        w.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        await w.drain()
        await asyncio.wait_for(r.read(65536), 5)
        for conn in srv.connections:
            seen.append(conn.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        w.close()
        await srv.stop()

    if loop_kind == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())
    assert seen and all(seen)


# ---- found by review (twenty-sixth session); each failed before its fix ----------------------------------------

def _post(body: bytes = b"hi", extra: bytes = b"") -> bytes:
    return b"POST /echo HTTP/1.1\r\nHost: x\r\n%bContent-Length: %d\r\n\r\n%b" % (extra, len(body), body)


async def test_pipelined_requests_wait_for_the_client_to_read_the_answers():
    # a client sending requests and never reading made the server buffer every answer (1.5 GB for 3,000 1 MB ones)
    srv = HttpServer(error_body, 1000)

    async def big(req):
        req.respond(200, b"x" * (1 << 20))

    srv.route("GET", "/big", big)
    await srv.start("127.0.0.1", 0)
    import socket

    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", srv.port))
    s.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(s, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
    await asyncio.sleep(0.5)
    (conn,) = srv.connections
    assert conn.transport.get_write_buffer_size() < 3 * (1 << 20)  # was ~200 MB: every answer written
    s.close()
    await srv.stop()


async def test_a_header_that_never_ends_is_refused_before_it_grows():
    srv = await _server()
    r, w = await asyncio.open_connection("127.0.0.1", srv.port)
    w.write(b"GET /stream HTTP/1.1\r\nHost: x\r\nX-Big: ")
    got = b""
    try:
        for _ in range(64):  # 4 MB of one header's value, no line end
            w.write(b"a" * 65536)
            await w.drain()
    except ConnectionError:
        pass
    try:
        got = await asyncio.wait_for(r.read(65536), 5)
    except ConnectionError:
        pass
    w.close()
    assert got.startswith(b"HTTP/1.1 431"), got[:100]
    await srv.stop()


async def test_head_never_gets_a_body_and_405_says_what_is_allowed():
    srv = await _server()
    out = await _exchange(srv.port, b"HEAD /nope HTTP/1.1\r\nHost: x\r\n\r\nHEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n"
                                    b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    heads = out.split(b"\r\n\r\n")
    assert heads[0].startswith(b"HTTP/1.1 404") and heads[1].startswith(b"HTTP/1.1 405")  # no bodies between them
    assert heads[2].startswith(b"HTTP/1.1 405") and b"Allow: POST\r\n" in heads[2] + b"\r\n"
    await srv.stop()


async def test_a_bad_request_after_a_good_one_is_answered_after_it():
    srv = await _server()
    out = await _exchange(srv.port, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n" + b"GARBAGE\r\n\r\n", until=b"}")
    assert out.startswith(b"HTTP/1.1 200") and b"data: 2" in out  # was closed with no answer to either
    assert b"HTTP/1.1 400" in out and out.index(b"HTTP/1.1 400") > out.index(b"data: 2")
    await srv.stop()


async def test_an_upgrade_is_ignored_and_the_request_answered():
    srv = await _server()
    out = await _exchange(srv.port, _post(b"hello", b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                                                    b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n") + _post(b"again"),
                          until=b'"query":""}')
    assert out.count(b"HTTP/1.1 200") == 2 and b'"len":5' in out  # was an empty reply
    await srv.stop()


async def test_100_continue_never_lands_inside_another_response():
    srv = await _server()
    out = await _exchange(srv.port, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"
                          + _post(b"hi", b"Expect: 100-continue\r\n"), until=b'"query":""}')
    first, _, rest = out.partition(b"0\r\n\r\n")  # the stream's end
    assert b"100 Continue" not in first and rest.startswith(b"HTTP/1.1 200")
    out = await _exchange(srv.port, b"POST /echo HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi")
    assert b"100 Continue" not in out  # (RFC 9110 10.1.1: not to an HTTP/1.0 client)
    await srv.stop()


async def test_chunked_trailers_are_not_request_headers():
    srv = HttpServer(error_body, 1000)
    seen = {}

    async def show(req):
        seen.update(req.headers)
        req.respond(200, b"{}")

    srv.route("POST", "/show", show)
    await srv.start("127.0.0.1", 0)
    await _exchange(srv.port, b"POST /show HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
                              b"\r\n2\r\nhi\r\n0\r\nAuthorization: Bearer smuggled\r\n\r\n")
    assert seen and "authorization" not in seen
    await srv.stop()


async def test_absolute_form_targets_and_http10_keep_alive():
    srv = await _server()
    out = await _exchange(srv.port, b"POST http://gateway.example/echo?q=1 HTTP/1.0\r\nConnection: keep-alive\r\n"
                                    b"Content-Length: 2\r\n\r\nhi", until=b"}")
    assert out.startswith(b"HTTP/1.1 200") and b'"path":"/echo"' in out and b'"query":"q=1"' in out
    assert b"Connection: keep-alive\r\n" in out
    await srv.stop()


async def test_a_request_arriving_behind_one_being_served_keeps_its_read_deadline_until_it_is_read():
    # the read deadline of a request received behind one still being answered ran while the server was busy: with
    # the first answer taking longer than request_timeout_s, the second (sent in full soon after) got a 408
    srv = HttpServer(error_body, 1000, request_timeout_s=0.2)
    gate = asyncio.Event()

    async def held(req):
        await gate.wait()
        req.respond(200, b"{}")

    async def echo(req):
        req.respond(200, orjson.dumps({"len": len(req.body)}))

    srv.route("GET", "/held", held)
    srv.route("POST", "/echo", echo)
    await srv.start("127.0.0.1", 0)
    r, w = await asyncio.open_connection("127.0.0.1", srv.port)
    second = _post(b"hello")
    w.write(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n" + second[:20])  # the second's head begins
    await w.drain()
    await asyncio.sleep(0.6)  # three of its read deadlines pass while the first is answered
    w.write(second[20:])
    await w.drain()
    gate.set()
    out = b""
    while out.count(b"HTTP/1.1 ") < 2 or not out.endswith(b"}"):
        chunk = await asyncio.wait_for(r.read(65536), 5)
        assert chunk, out
        out += chunk
    w.close()
    assert out.count(b"HTTP/1.1 200") == 2 and b'"len":5' in out, out
    await srv.stop()


async def test_request_bodies_arriving_at_once_are_bounded_over_every_connection():
    """Each request body was bounded (413 past max_body_bytes) but not their sum: 16 connections stalled mid-upload
    held 6 MiB each (+98 MB), as many as the client opened (memory audit, thirty-fifth session).  Past the server's
    budget the body that would cross it is refused with 503; the budget is given back whatever ends a body."""
    srv = await _server(max_body=1000)
    srv.max_buffered_bytes = 1500
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n"
    try:
        held = []
        for _ in range(3):  # three uploads stall after 600 of their 900 bytes: the third would cross 1,500
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)
            w.write(head + b"a" * 600)
            await w.drain()
            held.append((r, w))
            await asyncio.sleep(0.05)
        third = await asyncio.wait_for(held[2][0].read(65536), 5)
        assert b" 503 " in third.split(b"\r\n")[0] and b'"code":"overloaded"' in third and b"Retry-After: 1\r\n" in third
        assert srv.buffered == 1200
        r, w = held[0]
        w.write(b"a" * 300)  # the first completes: its body leaves the budget (the request's now)
        await w.drain()
        assert b'"len":900' in await asyncio.wait_for(r.read(65536), 5)
        assert srv.buffered == 600
        held[1][1].close()  # the second's client leaves mid-upload
        for _ in range(50):
            await asyncio.sleep(0.01)
            if srv.buffered == 0:
                break
        assert srv.buffered == 0
        # over the per-request limit: a 413, and nothing stays counted
        out = await _exchange(srv.port, b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                              b"3e8\r\n" + b"b" * 1000 + b"\r\n10\r\n" + b"c" * 16 + b"\r\n0\r\n\r\n")
        assert b" 413 " in out.split(b"\r\n")[0] and srv.buffered == 0
        assert b'"len":900' in await _exchange(srv.port, head + b"d" * 900, until=b"}")  # room again
        for _, w in held:
            w.close()
    finally:
        await srv.stop()
