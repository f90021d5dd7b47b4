#!/usr/bin/env python
"""Minimal streaming proxies on candidate HTTP stacks, for bench/overhead/stacks.py.

Each one does only what every gateway must: take ``POST /v1/chat/completions``
or ``/v1/completions``, pick an upstream round-robin, send the body there over a
pooled keep-alive connection, and relay the SSE response bytes to the client as
they arrive. No parsing of the JSON, no policy, no metrics. ``GET /health``
answers 200 (readiness). All run on uvloop.

    python stack_proxies.py aiohttp         --port 8001 --upstream http://127.0.0.1:9001 http://127.0.0.1:9002
    python stack_proxies.py steersman-http  --port 8002 --upstream ...
    STACKS_UPSTREAMS=http://…,http://… python -m granian --interface rsgi … stack_proxies:rsgi_app

- ``aiohttp``: ``aiohttp.web`` server + one ``aiohttp.ClientSession``; relays with
  ``async for data in upstream.content.iter_any(): await resp.write(data)``.
- ``steersman-http``: ``steersman.http.HttpServer`` + ``steersman.http.UpstreamPool``;
  relays with ``Exchange.pipe(request.send)`` (bytes written from the upstream
  protocol's ``data_received``, no await per chunk) - what the gateway's Forward
  stage does, without the pipeline around it.
- ``rsgi_app``: a granian RSGI app with an aiohttp ``ClientSession``; relays with
  ``await transport.send_bytes(data)`` per ``iter_any`` piece.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal

_JSON_CT = "application/json"


def _error_json(status: int, message: str, code: str) -> bytes:
    import json

    return json.dumps({"error": {"message": message, "type": "proxy_error", "param": None, "code": code}}).encode()


# --------------------------------------------------------------------------- (a) aiohttp server + client


async def serve_aiohttp(port: int, upstreams: list[str]) -> None:
    import aiohttp
    from aiohttp import web

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        skip_auto_headers=("User-Agent",),
    )
    rr = itertools.cycle(upstreams)

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with session.post(next(rr) + request.path, data=body, headers={"Content-Type": _JSON_CT}) as up:
            if up.status != 200:
                return web.Response(status=up.status, body=await up.read(), content_type=up.content_type)
            resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                           "Cache-Control": "no-cache"})
            await resp.prepare(request)
            async for data in up.content.iter_any():
                await resp.write(data)
            await resp.write_eof()
            return resp

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", relay)
    app.router.add_post("/v1/completions", relay)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=2048).start()
    try:
        await _until_signal()
    finally:
        await runner.cleanup()
        await session.close()


# --------------------------------------------------------------------------- (b) steersman.http, minimal


async def serve_steersman_http(port: int, upstreams: list[str]) -> None:
    from steersman.http import Endpoint, HttpRequest, HttpServer, UpstreamPool

    pool = UpstreamPool(connect_timeout_s=5.0, idle_timeout_s=60.0)
    eps = itertools.cycle([Endpoint.parse(u) for u in upstreams])
    json_hdr = b"Content-Type: application/json\r\n"

    async def relay(req: HttpRequest) -> None:
        ex = await pool.request(next(eps), b"POST", req.path, req.body, json_hdr)
        try:
            if ex.status != 200:
                req.respond(ex.status, await ex.read())
                return
            req.start_stream(200, b"text/event-stream")
            req.producer = ex  # client backpressure pauses the upstream socket
            ex.pipe(req.send)
            await ex.done()
            req.end_stream()
        finally:
            ex.abort()  # no-op when the response completed

    async def health(req: HttpRequest) -> None:
        req.respond(200, b"ok", b"text/plain")

    server = HttpServer(_error_json, max_body_bytes=1 << 20, idle_timeout_s=75.0)
    server.route("POST", "/v1/chat/completions", relay)
    server.route("POST", "/v1/completions", relay)
    server.route("GET", "/health", health)
    await server.start("127.0.0.1", port)
    try:
        await _until_signal()
    finally:
        await server.stop()
        await pool.close()


# --------------------------------------------------------------------------- (d) granian RSGI + aiohttp client

_rsgi_state: dict = {}


async def rsgi_app(scope, proto) -> None:
    """RSGI application (granian --interface rsgi); upstreams from $STACKS_UPSTREAMS (comma-separated)."""
    if scope.proto != "http":
        return
    if scope.path == "/health":
        proto.response_bytes(200, [("content-type", "text/plain")], b"ok")
        return
    st = _rsgi_state
    if not st:  # first request in this worker: its event loop is running now
        import aiohttp

        st["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            skip_auto_headers=("User-Agent",),
        )
        st["rr"] = itertools.cycle(os.environ["STACKS_UPSTREAMS"].split(","))
    body = await proto()
    async with st["session"].post(next(st["rr"]) + scope.path, data=body, headers={"Content-Type": _JSON_CT}) as up:
        if up.status != 200:
            proto.response_bytes(up.status, [("content-type", up.content_type)], await up.read())
            return
        tr = proto.response_stream(200, [("content-type", "text/event-stream"), ("cache-control", "no-cache")])
        async for data in up.content.iter_any():
            await tr.send_bytes(data)


# --------------------------------------------------------------------------- main


async def _until_signal() -> None:
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    await stop


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("stack", choices=["aiohttp", "steersman-http"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", nargs="+", required=True, help="engine base URLs, round-robin")
    a = ap.parse_args(argv)
    upstreams = [u.rstrip("/") for u in a.upstream]
    serve = serve_aiohttp if a.stack == "aiohttp" else serve_steersman_http
    import uvloop

    uvloop.run(serve(a.port, upstreams))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
