"""HttpServer.close_listener(idle_too=True), a refusing replica: idle keep-alive connections close at once, the ones
busy with a request or a stream close after their answer (never cut), until the server listens again."""

import asyncio

import orjson
import pytest

from steersman.api.errors import error_body
from steersman.http.server import HttpServer


async def _read_until_closed(r: asyncio.StreamReader) -> bytes:
    out = b""
    while chunk := await asyncio.wait_for(r.read(65536), 5):
        out += chunk
    return out


async def _read_until(r: asyncio.StreamReader, marker: bytes) -> bytes:
    return await asyncio.wait_for(r.readuntil(marker), 5)


async def test_idle_connections_close_busy_ones_finish_then_close_and_listening_again_keeps_alive():
    srv = HttpServer(error_body, 1000)
    answer, more = asyncio.Event(), asyncio.Event()

    async def echo(req):
        req.respond(200, orjson.dumps({"ok": True}))

    async def gated(req):
        await answer.wait()
        req.respond(200, b'{"late":true}')

    async def stream(req):
        req.start_stream()
        req.send(b"data: 1\n\n")
        await more.wait()
        req.send(b"data: 2\n\n")
        req.end_stream()

    srv.route("GET", "/echo", echo)
    srv.route("GET", "/gated", gated)
    srv.route("GET", "/stream", stream)
    port = await srv.start("127.0.0.1", 0)
    try:
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
        idle_w.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        await _read_until(idle_r, b'{"ok":true}')  # answered, kept alive: now idle
        busy_r, busy_w = await asyncio.open_connection("127.0.0.1", port)
        busy_w.write(b"GET /gated HTTP/1.1\r\nHost: x\r\n\r\n")
        stream_r, stream_w = await asyncio.open_connection("127.0.0.1", port)
        stream_w.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await _read_until(stream_r, b"data: 1\n\n")
        assert b"connection: close" not in head.lower()

        srv.close_listener(idle_too=True)
        assert await _read_until_closed(idle_r) == b""  # the idle one: closed, nothing sent
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
        answer.set()
        got = await _read_until_closed(busy_r)  # answered in full, then closed
        assert got.startswith(b"HTTP/1.1 200") and b"Connection: close" in got and got.endswith(b'{"late":true}')
        more.set()
        rest = await _read_until_closed(stream_r)  # the stream in flight went on to its end, then closed
        assert b"data: 2\n\n" in rest and rest.endswith(b"0\r\n\r\n")
        for w in (idle_w, busy_w, stream_w):
            w.close()

        await srv.start("127.0.0.1", port)  # listening again: connections are kept alive again
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await _read_until(r, b'{"ok":true}')
        assert b"connection: close" not in head.lower()
        w.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        await _read_until(r, b'{"ok":true}')
        w.close()
    finally:
        await srv.stop()
