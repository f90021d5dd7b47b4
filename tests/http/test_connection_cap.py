"""HttpServer's bound on open client connections (gateway.max_client_connections): at it a new connection closes the
keep-alive connection idle the longest, or, every one being busy, is answered 503 ``overloaded`` (OpenAI's format,
Retry-After, Connection: close) at once and closed; a request or stream in flight is never cut; the counts return to
zero.  Without the bound a client opening connections held every fd the process has (then the gateway could not
reach its engines)."""

import asyncio
import socket

import orjson
import pytest

import steersman.http._lifetime as lifetime_module
from steersman.api.errors import error_body
from steersman.http.server import HttpServer

GET = b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"


async def _until(cond, timeout: float = 5.0) -> None:
    """Wait for a condition the server reaches on its own (a connection closing), not for time to pass."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline
        await asyncio.sleep(0.005)


async def _read_until_closed(r: asyncio.StreamReader) -> bytes:
    out = b""
    while chunk := await asyncio.wait_for(r.read(65536), 5):
        out += chunk
    return out


async def _ask(r: asyncio.StreamReader, w: asyncio.StreamWriter, request: bytes = GET, until: bytes = b"}") -> bytes:
    w.write(request)
    return await asyncio.wait_for(r.readuntil(until), 5)


def _parse(raw: bytes) -> tuple[bytes, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
    return status.encode(), headers, orjson.loads(body)


def _server(cap: int) -> tuple[HttpServer, dict]:
    srv = HttpServer(error_body, 1000, max_connections=cap)
    state = {"entered": 0, "gate": asyncio.Event(), "more": asyncio.Event(), "told": []}

    async def echo(req):
        req.respond(200, orjson.dumps({"ok": True}))

    async def gated(req):
        state["entered"] += 1
        await state["gate"].wait()
        req.respond(200, b'{"late":true}')

    async def stream(req):
        state["entered"] += 1
        req.start_stream()
        req.send(b"data: 1\n\n")
        await state["more"].wait()
        req.send(b"data: 2\n\n")
        req.end_stream()

    def on_error(status, headers):
        state["told"].append((status, headers))
        return b"X-Request-Id: rid-%d\r\n" % len(state["told"])

    srv.route("GET", "/echo", echo)
    srv.route("GET", "/gated", gated)
    async def big(req):
        req.respond(200, b"x" * (16 << 20))

    srv.route("GET", "/stream", stream)
    srv.route("GET", "/big", big)
    srv.on_error = on_error
    return srv, state


async def test_every_connection_busy_a_new_one_is_answered_503_overloaded_at_once_and_none_in_flight_is_cut():
    srv, state = _server(3)
    port = await srv.start("127.0.0.1", 0)
    try:
        busy = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        for r, w in busy[:2]:
            w.write(b"GET /gated HTTP/1.1\r\nHost: x\r\n\r\n")
        busy[2][1].write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(busy[2][0].readuntil(b"data: 1\n\n"), 5)  # a stream under way
        await _until(lambda: state["entered"] == 3)
        assert len(srv.connections) == 3 and srv.busy_connections == 3

        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /gated HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = _parse(await _read_until_closed(r))  # answered, then closed by the server
        w.close()
        assert status == b"HTTP/1.1 503 Service Unavailable"
        assert headers["retry-after"] == "1" and headers["connection"] == "close"
        assert headers["content-type"] == "application/json" and headers["x-request-id"] == "rid-1"
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == "overloaded" and body["error"]["type"] == "server_error"
        assert state["told"] == [(503, None)]  # counted by the gateway's hook, as its other own answers
        assert state["entered"] == 3  # its request was never read, let alone dispatched
        assert len(srv.connections) == 3  # never counted

        state["gate"].set()
        state["more"].set()
        for r, _ in busy[:2]:
            assert (await asyncio.wait_for(r.readuntil(b'{"late":true}'), 5)).startswith(b"HTTP/1.1 200 ")
        assert b"data: 2\n\n" in await asyncio.wait_for(busy[2][0].readuntil(b"\r\n0\r\n\r\n"), 5)  # whole
        for _, w in busy:
            w.close()
        await _until(lambda: not srv.connections and not srv.idle and not srv.refused)
        assert srv.buffered == 0
    finally:
        await srv.stop()


async def test_at_the_bound_the_connection_idle_the_longest_is_closed_to_make_room_never_a_busy_one():
    srv, state = _server(3)
    port = await srv.start("127.0.0.1", 0)
    try:
        a = await asyncio.open_connection("127.0.0.1", port)
        b = await asyncio.open_connection("127.0.0.1", port)
        c = await asyncio.open_connection("127.0.0.1", port)
        assert b" 200 " in await _ask(*a)  # a idle, then b idle, then a again: b has been idle the longest
        assert b" 200 " in await _ask(*b)
        assert b" 200 " in await _ask(*a)
        c[1].write(b"GET /gated HTTP/1.1\r\nHost: x\r\n\r\n")  # c busy
        await _until(lambda: state["entered"] == 1)
        assert len(srv.connections) == 3 and list(srv.idle) and len(srv.idle) == 2

        d = await asyncio.open_connection("127.0.0.1", port)
        assert b" 200 " in await _ask(*d)  # served: b made room
        assert await _read_until_closed(b[0]) == b""  # b: closed between requests, nothing sent
        assert b" 200 " in await _ask(*a)  # a kept alive (now idle after d)
        assert len(srv.connections) == 3

        e = await asyncio.open_connection("127.0.0.1", port)  # d has been idle the longest now
        assert b" 200 " in await _ask(*e)
        assert await _read_until_closed(d[0]) == b""
        assert b" 200 " in await _ask(*a)
        state["gate"].set()
        assert b'{"late":true}' in await asyncio.wait_for(c[0].readuntil(b"}"), 5)  # the busy one was never cut
        assert state["told"] == []  # nobody refused
        for _, w in (a, b, c, d, e):
            w.close()
        await _until(lambda: not srv.connections and not srv.idle and not srv.refused)
    finally:
        await srv.stop()


async def test_a_connection_that_has_not_been_answered_yet_is_not_closed_to_make_room_and_one_closing_makes_room():
    # a new connection's request may be on its way: closing it for a newcomer made a burst at the bound close its
    # own newcomers (a review's repro: 9 of 10 clients cut, none answered 503); the newcomer is refused instead
    srv, state = _server(2)
    port = await srv.start("127.0.0.1", 0)
    try:
        quiet = await asyncio.open_connection("127.0.0.1", port)  # connected, sends nothing yet
        busy = await asyncio.open_connection("127.0.0.1", port)
        busy[1].write(b"GET /gated HTTP/1.1\r\nHost: x\r\n")  # a request arriving (its head unfinished): busy
        await _until(lambda: any(c._in_message for c in srv.connections))
        refused = await asyncio.open_connection("127.0.0.1", port)
        got = await _read_until_closed(refused[0])
        assert b" 503 " in got and b"overloaded" in got  # neither of the two was closed for it
        refused[1].close()
        assert b" 200 " in await _ask(*quiet)  # its request, sent late, is answered: now it is idle

        new = await asyncio.open_connection("127.0.0.1", port)
        assert b" 200 " in await _ask(*new)
        assert await _read_until_closed(quiet[0]) == b""  # the one answered and idle made room
        new[1].close()  # one closes: room without closing anyone
        await _until(lambda: len(srv.connections) == 1)
        later = await asyncio.open_connection("127.0.0.1", port)
        assert b" 200 " in await _ask(*later)
        busy[1].write(b"\r\n")  # the arriving request completes, served
        await _until(lambda: state["entered"] == 1)
        state["gate"].set()
        assert b'{"late":true}' in await asyncio.wait_for(busy[0].readuntil(b"}"), 5)
        assert len(srv.connections) == 2 and len(state["told"]) == 1
        for _, w in (quiet, busy, new, later):
            w.close()
        await _until(lambda: not srv.connections and not srv.idle)
    finally:
        await srv.stop()


async def test_refused_connections_wait_for_their_client_to_close_only_up_to_a_bound(monkeypatch):
    """A refusal half-closes and lets the client read the 503 and close (a socket closed with the request unread
    resets); a client that never closes cannot make refusals hold fds: past the bound a refusal closes at once."""
    monkeypatch.setattr(lifetime_module, "_MAX_REFUSED_LINGERING", 1)
    srv, state = _server(1)
    port = await srv.start("127.0.0.1", 0)
    try:
        held = await asyncio.open_connection("127.0.0.1", port)
        held[1].write(b"GET /gated HTTP/1.1\r\nHost: x\r\n\r\n")
        await _until(lambda: state["entered"] == 1)
        first = await asyncio.open_connection("127.0.0.1", port)
        assert b'"code":"overloaded"' in await _read_until_closed(first[0])  # the server's half-close: EOF
        assert len(srv.refused) == 1  # its client has not closed: it waits
        first[1].write(GET)  # what the client still sends is discarded, not answered
        second = await asyncio.open_connection("127.0.0.1", port)
        assert b'"code":"overloaded"' in await _read_until_closed(second[0])
        assert len(srv.refused) == 1 and len(srv.connections) == 1  # the second was closed at once
        first[1].close()
        await _until(lambda: not srv.refused)  # its client closed: so does the server
        second[1].close()
        assert [s for s, _ in state["told"]] == [503, 503]
        state["gate"].set()
        assert b'{"late":true}' in await asyncio.wait_for(held[0].readuntil(b"}"), 5)
        held[1].close()
        await _until(lambda: not srv.connections and not srv.idle)
    finally:
        await srv.stop()


async def test_stop_closes_refused_connections_still_waiting_for_their_client():
    srv, state = _server(1)
    port = await srv.start("127.0.0.1", 0)
    held = await asyncio.open_connection("127.0.0.1", port)
    held[1].write(b"GET /gated HTTP/1.1\r\nHost: x\r\n\r\n")
    await _until(lambda: state["entered"] == 1)
    refused = await asyncio.open_connection("127.0.0.1", port)
    assert b" 503 " in await _read_until_closed(refused[0])
    assert len(srv.refused) == 1
    await srv.stop()
    await _until(lambda: not srv.refused and not srv.connections)
    for _, w in (held, refused):
        w.close()


def test_without_a_bound_the_server_counts_no_cap():
    """engine-sim's server (whose only client is a gateway) keeps no bound but the fd limit, as before."""
    srv = HttpServer(error_body, 1000)
    assert srv.max_connections is None


@pytest.mark.parametrize("cap", [1, 2])
async def test_serial_clients_at_a_small_bound_each_get_served_and_nothing_stays_counted(cap):
    """Connections opened and closed one after another never hit the bound: a closed one leaves every count."""
    srv, state = _server(cap)
    port = await srv.start("127.0.0.1", 0)
    try:
        for _ in range(5):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            assert b" 200 " in await _ask(r, w, b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert await _read_until_closed(r) == b""
            w.close()
            await _until(lambda: not srv.connections and not srv.idle)
        assert state["told"] == []
    finally:
        await srv.stop()


async def test_start_warns_when_the_fd_limit_cannot_hold_the_bound(monkeypatch, caplog):
    """Past the fd limit the bound does nothing (accept fails, and the engine connections with it): say so."""
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 1024))
    for cap, warned in ((512, False), (8192, True)):
        caplog.clear()
        srv = HttpServer(error_body, 1000, max_connections=cap)
        await srv.start("127.0.0.1", 0)
        await srv.stop()
        assert any("max_client_connections (8192)" in r.getMessage() for r in caplog.records) == warned


async def test_an_idle_connection_whose_answer_is_still_unread_is_not_closed_to_make_room():
    # a review's repro: closing it waits for the client to read, so it never left ``connections`` while make_room
    # said it had made room: each newcomer added one (9 open at a bound of 3); such a connection is not chosen
    srv, state = _server(2)
    port = await srv.start("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.setblocking(False)
    await loop.sock_connect(slow, ("127.0.0.1", port))
    try:
        await loop.sock_sendall(slow, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
        await _until(lambda: any(c._current is None and c.transport and c.transport.get_write_buffer_size()
                                 for c in srv.connections))  # answered, its bytes unsent: "idle"
        a = await asyncio.open_connection("127.0.0.1", port)
        assert b" 200 " in await _ask(*a)  # a: answered, idle, read
        b = await asyncio.open_connection("127.0.0.1", port)
        assert b" 200 " in await _ask(*b)  # room made by closing a, not the slow one
        assert await _read_until_closed(a[0]) == b""
        c = await asyncio.open_connection("127.0.0.1", port)
        assert b" 200 " in await _ask(*c)  # b made room
        assert len(srv.connections) <= 2 + 1  # (b leaving in its connection_lost): the bound holds
        await _until(lambda: len(srv.connections) == 2)
        for _, w in (a, b, c):
            w.close()
    finally:
        slow.close()
        await srv.stop()


async def test_a_burst_of_new_clients_at_the_bound_gets_503s_not_closed_connections():
    srv, state = _server(2)
    port = await srv.start("127.0.0.1", 0)
    try:
        busy = await asyncio.open_connection("127.0.0.1", port)
        busy[1].write(b"GET /gated HTTP/1.1\r\nHost: x\r\n\r\n")
        await _until(lambda: state["entered"] == 1)
        clients = []
        for _ in range(6):  # connect together, send a moment later (a connect-to-send gap)
            clients.append(await asyncio.open_connection("127.0.0.1", port))
        for _, w in clients:
            w.write(GET)
        answers = [await _read_until_closed(r) if i else await asyncio.wait_for(r.readuntil(b"}"), 5)
                   for i, (r, _) in enumerate(clients)]
        assert b" 200 " in answers[0]  # the first took the free place
        assert all(b" 503 " in a and b"overloaded" in a for a in answers[1:])  # each told, none cut silently
        state["gate"].set()
        for _, w in (busy, *clients):
            w.close()
        await _until(lambda: not srv.connections and not srv.idle and not srv.refused)
    finally:
        await srv.stop()


@pytest.mark.parametrize("close", [False, True])
async def test_an_answer_left_unread_past_the_idle_timeout_is_reset_one_read_slowly_is_not(close):
    # a close waits for the client to take what is buffered: a client that stopped reading held its connection (and
    # a place under the bound) for ever, a keep-alive one and one answered with Connection: close alike; one still
    # reading, however slowly, gets its whole answer (the timeout runs from the last progress, as nginx's send_timeout)
    srv = HttpServer(error_body, 1000, idle_timeout_s=2.0, max_connections=8)
    body = b"x" * (12 << 20)

    async def big(req):
        if close:
            req.keep_alive = False
        req.respond(200, body)

    srv.route("GET", "/big", big)
    port = await srv.start("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    socks = []
    try:
        for k in range(2):
            s = socket.socket()
            if k == 0:  # the stalled one takes little into its kernel buffer
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setblocking(False)
            await loop.sock_connect(s, ("127.0.0.1", port))
            await loop.sock_sendall(s, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(s)
        stalled, slow = socks
        got = 0
        while True:  # the slow one reads 64 KiB every 20 ms: ~4 s for 12 MiB, several idle timeouts (the kernel's
            # send buffer, ~MBs, lets the server see progress only every few hundred ms)
            chunk = await asyncio.wait_for(loop.sock_recv(slow, 65536), 5)
            if not chunk:
                break
            got += len(chunk)
            if got >= len(body):
                break
            await asyncio.sleep(0.02)
        assert got >= len(body)  # (its head too)
        # the stalled one is reset, not held; the slow one's stays open if kept alive (its idle timeout is later)
        await _until(lambda: len(srv.connections) == (0 if close else 1))
        assert all(c.transport.get_write_buffer_size() == 0 for c in srv.connections)  # (the slow one's)
    finally:
        for s in socks:
            s.close()
        await srv.stop()


async def test_a_stream_whose_client_stops_taking_it_is_reset_one_taken_slowly_is_not():
    # a client that stops reading a stream without closing held its handler (the engine request, its tenant's
    # concurrency place) as long as it kept the connection: the gateway stopped reading the engine (backpressure)
    # and nothing timed it; one still reading, however slowly, gets the whole stream
    srv = HttpServer(error_body, 1000, idle_timeout_s=2.0)
    cancelled = []

    async def stream(req):
        req.start_stream()
        try:
            for _ in range(192):  # 12 MiB of events
                req.send(b"data: " + b"x" * 65528 + b"\n\n")
                await req.drain()
            req.end_stream()
        except asyncio.CancelledError:
            cancelled.append(req)
            raise

    srv.route("GET", "/stream", stream)
    port = await srv.start("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    socks = []
    try:
        for k in range(2):
            s = socket.socket()
            if k == 0:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setblocking(False)
            await loop.sock_connect(s, ("127.0.0.1", port))
            await loop.sock_sendall(s, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(s)
        stalled, slow = socks
        got = b""
        while not got.endswith(b"0\r\n\r\n"):  # the slow one: 64 KiB every 20 ms, ~4 s, two idle timeouts
            chunk = await asyncio.wait_for(loop.sock_recv(slow, 65536), 5)
            assert chunk, "the slow reader's stream was cut"
            got += chunk[-8:] if len(got) > 16 else chunk
            await asyncio.sleep(0.02)
        await _until(lambda: len(cancelled) == 1)  # the stalled one: reset, its handler cancelled
        assert len(srv.connections) == 1
    finally:
        for s in socks:
            s.close()
        await srv.stop()
