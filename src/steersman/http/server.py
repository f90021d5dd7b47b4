"""A small HTTP/1.1 server for the gateway's hot path: asyncio protocols + httptools.

Chosen by measurement (``bench/overhead``, see its README): relaying a 16-chunk
stream costs ~2.3x less CPU than aiohttp's server and client because nothing
awaits per chunk — upstream bytes are written to the client socket from the
upstream protocol's ``data_received``.

What it does: keep-alive (one request at a time per connection; pipelined
requests wait in a short queue, each started once the client has read the
answers before it; a protocol error among them is answered after them),
``Content-Length`` and chunked request bodies (trailers are not headers) with
a size limit (413), a header size limit (431, also for a header still
arriving), ``Expect: 100-continue`` (never inside another response), ``Upgrade``
ignored (the request answered over HTTP/1.1), ``Allow`` on a 405, no body for HEAD,
chunked streaming responses (close-delimited for HTTP/1.0 clients),
backpressure (a paused client socket pauses the registered producer), an idle
timeout, and cancellation: a client that disconnects cancels its handler task.
A bound on open connections (``max_connections``): at it, a new connection
closes the keep-alive connection idle the longest, or, none being idle, is
answered 503 ``overloaded`` (``Retry-After``, ``Connection: close``) at once,
without reading its request, and closed.
Protocol errors are answered through ``error_body`` (the OpenAI error format).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping

from steersman.config import DEFAULTS
from steersman.http._connection import _Connection
from steersman.http.request import HttpRequest

__all__ = ["HttpRequest", "HttpServer", "Handler", "http_url"]

log = logging.getLogger("steersman.http")

Handler = Callable[["HttpRequest"], Awaitable[None]]
ErrorBody = Callable[[int, str, str], bytes]


class HttpServer:
    """Routes ``(method, path)`` to async handlers; everything else is 404/405 in ``error_body``'s format."""

    def __init__(self, error_body: ErrorBody, max_body_bytes: int, idle_timeout_s: float = 75.0,
                 request_timeout_s: float = DEFAULTS.gateway.client_request_timeout_s,
                 max_buffered_bytes: float = DEFAULTS.gateway.max_buffered_body_mib * 2**20,
                 max_connections: int | None = None) -> None:
        self.error_body = error_body
        self.max_body_bytes = max_body_bytes
        #: request body bytes still arriving, over every connection, and their bound (past it: 503)
        self.buffered = 0
        self.max_buffered_bytes = max_buffered_bytes
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s  # to receive one whole request once its first byte came
        self.routes: dict[tuple[str, str], Handler] = {}
        self.prefixes: list[tuple[str, str, Handler]] = []  # (method, path prefix, handler): paths with an id
        self.connections: set[_Connection] = set()
        #: the bound on :attr:`connections` (None: only the fd limit; engine-sim's, whose only client is a gateway)
        self.max_connections = max_connections
        self._cap = max_connections if max_connections is not None else float("inf")
        #: the connections idle between requests (once one has been answered: a new one's request may be on its way),
        #: the one idle the longest first: the ones a new connection may close at the bound (kept by
        #: :class:`_Connection`; nothing in flight or arriving is ever in it)
        self.idle: OrderedDict[_Connection, None] = OrderedDict()
        #: connections refused at the bound, answered and half-closed, waiting for the client to close (not counted
        #: in :attr:`connections`; at most ``_MAX_REFUSED_LINGERING`` of them)
        self.refused: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._refusing = False  # close_listener(idle_too=True) until start: every response closes its connection
        self._drained: asyncio.Future | None = None  # drain(): set once the last connection has closed
        self.port = 0
        #: optional ``on_error(status, headers) -> header lines``: told of every answer the server gives itself (a
        #: malformed or oversized request, no such route, an internal error), before any handler; what it returns is
        #: sent with the answer (the gateway counts it and names it with an X-Request-Id, as its other answers)
        self.on_error: Callable[[int, Mapping[str, str] | None], bytes] | None = None

    def error_extra(self, status: int, headers: Mapping[str, str] | None) -> bytes:
        """The header lines :attr:`on_error` gives an answer the server makes itself (none without it)."""
        return b"" if self.on_error is None else self.on_error(status, headers)

    def make_room(self) -> bool:
        """At the connection bound: close the keep-alive connection idle the longest (nginx, out of
        worker_connections, closes idle keep-alive ones too).  False when none is idle (every connection has a
        request arriving, in flight or queued: none is cut)."""
        idle = self.idle
        while idle:
            c, _ = idle.popitem(last=False)
            t = c.transport
            if t is None or c._current is not None or c._in_message or c._queue or c._rejected:
                continue  # (not idle any more)
            if t.get_write_buffer_size():
                # its answer still unread: a close would wait for the client, so it is not this one; out of the order
                # (each scanned once), back in it once the client has read (resume_writing), else its idle timeout
                # closes or resets it
                continue
            t.close()  # (it leaves ``connections`` in connection_lost, its fd with it)
            return True
        return False

    def route(self, method: str, path: str, handler: Handler) -> None:
        """``path`` exactly, or, ending in ``/``, every path under it (the handler reads the rest)."""
        if path.endswith("/"):
            self.prefixes.append((method, path, handler))
        else:
            self.routes[(method, path)] = handler

    def _find(self, method: str, path: str) -> Handler | None:
        handler = self.routes.get((method, path))
        if handler is None and self.prefixes:
            handler = next((h for m, p, h in self.prefixes if m == method and path.startswith(p) and path != p), None)
        return handler

    def _allowed(self, path: str) -> list[str]:
        """The methods ``path`` has handlers for (HEAD where GET), for a 405's ``Allow`` (RFC 9110 15.5.6)."""
        methods = {m for m, p in self.routes if p == path}
        methods |= {m for m, p, _ in self.prefixes if path.startswith(p) and path != p}
        if "GET" in methods:
            methods.add("HEAD")
        return sorted(methods)

    async def dispatch(self, req: HttpRequest) -> None:
        handler = self._find(req.method, req.path)
        if req.method == "HEAD":  # a GET's headers alone (RFC 9110 9.3.2): health checks use it; never a body
            req.head_only = True
            if handler is None:
                handler = self._find("GET", req.path)
        if self._refusing and not req.conn._queue and not req.conn._in_message:
            # answered with Connection: close (a refusing server keeps no connection), unless requests follow it on
            # this connection (pipelined, or arriving): they are answered too, the last one closing it
            req.keep_alive = False
        try:
            if handler is None:
                allowed = self._allowed(req.path)
                if allowed:
                    req.respond(405, self.error_body(405, f"Method {req.method} is not allowed on {req.path}.", "method_not_allowed"),
                                extra=b"Allow: %b\r\n%b" % (", ".join(allowed).encode(), self.error_extra(405, req.headers)))
                else:
                    req.respond(404, self.error_body(404, f"No such endpoint: {req.path}.", "not_found"),
                                extra=self.error_extra(404, req.headers))
                return
            await handler(req)
            if not req.started:
                raise RuntimeError(f"handler for {req.path} returned without answering")
            if req._state == 1:
                req.end_stream()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("internal error on %s %s", req.method, req.path)
            if not req.started:
                extra = self.error_extra(500, req.headers)
                req.respond(500, self.error_body(500, "Internal server error.", "internal_error"),
                            extra=b"" if b"X-Request-Id:" in req.extra_headers else extra)  # (named already: one id)
            elif req.conn.transport is not None:
                req.conn.transport.close()

    async def start(self, host: str, port: int, reuse_port: bool = False) -> int:
        """Listen on ``host:port`` (0: a free port); ``reuse_port``: SO_REUSEPORT, beside other listeners that set it
        (the kernel spreads new connections over them; ``gateway.reuse_port``)."""
        loop = asyncio.get_running_loop()
        _check_fd_limit(self.max_connections)
        self._server = await loop.create_server(lambda: _Connection(self), host, port, reuse_address=True, backlog=2048,
                                                reuse_port=reuse_port or None)
        self._refusing = False
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def close_listener(self, idle_too: bool = False) -> None:
        """Stop listening (new connections are refused) and keep the open ones; :meth:`start` listens again.

        ``idle_too``: refuse the clients' pooled keep-alive connections as well (a client holding one would go on
        being served): the idle ones close now, every other one once its response is complete (a request or stream
        in flight is never cut; what it answers says ``Connection: close``), until :meth:`start`."""
        if self._server is not None:
            self._server.close()
        if idle_too:
            self._refusing = True
            for c in list(self.connections):
                if c._current is not None:
                    if not c._queue and not c._in_message:
                        c._current.keep_alive = False  # closed by ``finished`` after its last byte
                    # (else the requests behind it are answered, then the connection closes once idle: ``_next``)
                elif not c._in_message and not c._queue and c.transport is not None:
                    c.transport.close()  # idle (one being received or waiting its turn is dispatched as refusing)

    async def drain(self, timeout_s: float) -> int:
        """Graceful shutdown's first half: stop listening, close the idle keep-alive connections, and let every
        request already received (or still arriving on an open connection) be answered to its last byte, each
        response closing its connection (:meth:`close_listener` with ``idle_too``); wait until no connection is
        left or ``timeout_s`` has passed.  Returns the connections still open then (:meth:`stop` cuts them)."""
        self.close_listener(idle_too=True)
        await self._until_closed(timeout_s)
        return len(self.connections)

    async def _until_closed(self, timeout_s: float) -> None:
        """Wait until no connection is left (each leaves in its ``connection_lost``), at most ``timeout_s``."""
        if not self.connections or timeout_s <= 0:
            return
        self._drained = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._drained), timeout_s)
        except TimeoutError:
            pass
        finally:
            self._drained = None

    @property
    def busy_connections(self) -> int:
        """Connections with a request being answered, received or waiting its turn (not idle keep-alive ones)."""
        return sum(1 for c in self.connections if c._current is not None or c._in_message or c._queue)

    def connection_closed(self) -> None:
        """A connection has left :attr:`connections` (called by it): a drain waiting for the last one ends."""
        if self._drained is not None and not self.connections and not self._drained.done():
            self._drained.set_result(None)

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop listening, close every connection (a handler still answering is cancelled); after ``grace_s`` reset
        the ones still open (a close waits for what is buffered to be sent: a client not reading would hold it)."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        for c in [*self.connections, *self.refused]:
            if c.transport is not None:
                c.transport.close()
        await self._until_closed(grace_s)  # (server.wait_closed() does not wait for them once closed: uvloop's, asyncio's)
        left = [c for c in (*self.connections, *self.refused) if c.transport is not None]
        tasks = [c._task for c in left if c._task is not None and not c._task.done()]
        for c in left:
            c.transport.abort()  # its connection_lost (the loop's next turn) cancels its handler
        if tasks:  # the handlers' cancellations run before the caller closes what they use (engine connections)
            await asyncio.wait(tasks, timeout=grace_s)


def http_url(host: str, port: int) -> str:
    """The URL a server listening on ``host``:``port`` is reached at (an IPv6 literal in brackets, RFC 3986)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _check_fd_limit(max_connections: int | None) -> None:
    """Warn when the process's fd limit cannot hold ``max_connections`` client connections each with its engine
    connection (Envoy's rule: connection limits under half the fd limit): past it the fd limit, not the bound,
    refuses connections, and the engine connections fail with them."""
    if max_connections is None:
        return
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return
    if soft != resource.RLIM_INFINITY and 2 * max_connections > soft:
        log.warning("the open file limit (%d, `ulimit -n`) is under twice max_client_connections (%d): each client "
                    "connection being served holds an engine connection too; raise the limit or lower the bound "
                    "well under %d", soft, max_connections, soft // 2)
