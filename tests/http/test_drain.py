"""HttpServer.drain, a graceful shutdown's first half: new connections are refused and idle ones close at once, the
requests and streams in flight are answered to their last byte (each closing its connection), and drain returns when
the last connection has closed, or after its timeout with the number still open (stop cuts those)."""

import asyncio

import pytest

from steersman.api.errors import error_body
from steersman.http.server import HttpServer


async def _read_until_closed(r: asyncio.StreamReader) -> bytes:
    out = b""
    while chunk := await asyncio.wait_for(r.read(65536), 5):
        out += chunk
    return out


def _server():
    srv = HttpServer(error_body, 1000)
    more = asyncio.Event()

    async def echo(req):
        req.respond(200, b'{"ok":true}')

    async def stream(req):
        req.start_stream()
        req.send(b"data: 1\n\n")
        await more.wait()
        req.send(b"data: 2\n\n")
        req.end_stream()

    srv.route("GET", "/echo", echo)
    srv.route("GET", "/stream", stream)
    return srv, more


async def test_drain_lets_a_stream_in_flight_finish_refuses_new_connections_and_returns_when_it_has():
    srv, more = _server()
    port = await srv.start("127.0.0.1", 0)
    try:
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
        idle_w.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(idle_r.readuntil(b'{"ok":true}'), 5)
        stream_r, stream_w = await asyncio.open_connection("127.0.0.1", port)
        stream_w.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(stream_r.readuntil(b"data: 1\n\n"), 5)
        assert srv.busy_connections == 1

        drain = asyncio.ensure_future(srv.drain(30.0))
        assert await _read_until_closed(idle_r) == b""  # the idle keep-alive connection: closed, nothing sent
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
        await asyncio.sleep(0)
        assert not drain.done()  # the stream is still in flight
        more.set()
        rest = await _read_until_closed(stream_r)  # to its last byte, then closed
        assert b"data: 2\n\n" in rest and rest.endswith(b"0\r\n\r\n")
        assert await asyncio.wait_for(drain, 5) == 0  # returned with the last connection, not at its timeout
        for w in (idle_w, stream_w):
            w.close()
    finally:
        await srv.stop()


async def test_drain_gives_up_after_its_timeout_and_says_how_many_are_left():
    srv, more = _server()
    port = await srv.start("127.0.0.1", 0)
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(r.readuntil(b"data: 1\n\n"), 5)
        assert await srv.drain(0.05) == 1  # the stream never ends: left to stop
        await srv.stop()
        assert b"data: 2" not in await _read_until_closed(r)  # cut
        w.close()
    finally:
        await srv.stop()


async def test_drain_with_nothing_in_flight_returns_at_once_and_a_zero_timeout_does_not_wait():
    srv, more = _server()
    port = await srv.start("127.0.0.1", 0)
    try:
        assert await asyncio.wait_for(srv.drain(30.0), 1) == 0
        srv2, _ = _server()
        port = await srv2.start("127.0.0.1", 0)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(r.readuntil(b"data: 1\n\n"), 5)
        assert await asyncio.wait_for(srv2.drain(0.0), 1) == 1
        await srv2.stop()
        w.close()
    finally:
        await srv.stop()
