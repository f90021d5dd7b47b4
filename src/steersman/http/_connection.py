"""One client connection of the gateway's HTTP/1.1 server (:mod:`steersman.http.server`): an asyncio protocol
driving httptools, with the per-connection rules the server's docstring lists (pipelining in order and behind the
client's reading, limits, deadlines, interim answers, Upgrade ignored, backpressure to the producer)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import httptools

from steersman.http._lifetime import _OVERLOAD_RETRY_AFTER, _REJECT_GRACE_S, _Lifetime
from steersman.http.request import HttpRequest, _status_line

if TYPE_CHECKING:
    from steersman.http.server import HttpServer

_MAX_HEADER_BYTES = 64 * 1024
_MAX_PIPELINED = 8
_READ_SLACK = 256 * 1024  # a read's bytes before its message's head began (the end of the one before it)


class _Connection(_Lifetime, asyncio.Protocol):
    __slots__ = (
        "server", "loop", "transport", "parser", "_url", "_headers", "_hname", "_body", "_size", "_header_bytes",
        "_queue", "_current", "_task", "_paused_writing", "_drain", "_timer", "_timer_at", "_due", "_on_due", "_rejected",
        "_in_head", "_head_raw", "_in_message", "_later", "_upgrading", "_upgrade_buf", "_hosts", "_held", "_unsent",
    )

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        # the protocol factory runs on the loop: keep it (CPython 3.11's get_running_loop() makes a getpid
        # syscall per call, and the request path needed it ~6 times per request)
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self._reset_message()
        self._queue: deque[HttpRequest] = deque()
        self._current: HttpRequest | None = None
        self._task: asyncio.Task | None = None
        self._paused_writing = False
        self._in_message = False  # a request is being received (its headers or body)
        self._later: tuple[int, str, str] | None = None  # a protocol error to answer once the requests before it are
        self._upgrading: tuple | None = None  # a request asking for an Upgrade, whose body is read here (see below)
        self._upgrade_buf = b""
        self._drain: asyncio.Future | None = None
        # one timer for both deadlines (a whole request must arrive in time; an idle connection closes): moving a
        # deadline later only moves ``_due``, and the timer, when it fires early, re-arms itself for the rest
        # (two timers made and cancelled per request cost more than the rest of the keep-alive handling)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._due: float | None = None  # loop time of the current deadline (None: a handler is running)
        self._on_due: Callable[[], None] | None = None
        self._rejected = False
        self._unsent = 0  # bytes answered and not yet taken by the client when its idle period began
        self._held = 0  # body bytes of the message arriving, counted in the server's ``buffered``

    def _release(self) -> None:
        """The body bytes this connection holds leave the server's budget (the message is whole, refused or gone)."""
        held = self._held
        if held:
            self._held = 0
            self.server.buffered -= held

    def _reset_message(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._hname = b""
        self._body: list[bytes] = []
        self._size = 0
        self._header_bytes = 0  # the message's complete headers so far
        self._hosts = 0  # Host header lines (RFC 9112 3.2: exactly one in an HTTP/1.1 request)
        self._head_raw = 0  # the reads that ended inside its head (so at most one read more than the head itself)
        self._in_head = False  # its headers are still arriving (anything ``on_header`` gets after them: trailers)

    # -- transport events ---------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # no TCP_NODELAY here: uvloop and asyncio's own loop set it on every TCP transport they make (a
        # setsockopt and a socket object per accepted connection saved; tests/http/test_http_server.py pins it)
        self.transport = transport
        srv = self.server
        conns = srv.connections
        if srv._refusing and (srv._server is None or not srv._server.is_serving()):
            # accepted in the loop turn the listener closed (a drain): closed before its request, as the listener
            # would have refused it (the client retries elsewhere), not left idle to hold the drain to its timeout
            transport.close()
            return
        if len(conns) >= srv._cap and not srv.make_room():
            self._refuse(transport)
            return
        conns.add(self)
        # not in ``server.idle`` until it has been answered once: a new connection whose request is on its way is
        # never closed to make room (a burst at the bound would close its own newcomers); it has the idle deadline
        self._deadline(srv.idle_timeout_s, self._idle_close)

    def connection_lost(self, exc: Exception | None) -> None:
        srv = self.server
        srv.connections.discard(self)
        srv.idle.pop(self, None)
        if self._rejected:
            srv.refused.discard(self)
        srv.connection_closed()
        self._release()
        self.transport = None
        self._due = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client went away: cancel its request
        # the parser, the request, its task and the deadline action reference this connection: dropping them
        # leaves no cycle for the garbage collector (a client opening a connection per request made one each)
        self._task = self._current = self._on_due = None
        self.parser = None  # type: ignore[assignment]
        self._queue.clear()
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("client disconnected"))

    def eof_received(self) -> bool:
        return False  # a client half-close ends the connection (and cancels what it asked for)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if self._upgrading is not None:
            self._upgrade_body(data)
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:
            # ``Upgrade: h2c`` (curl --http2 on http://), websocket: a server may ignore Upgrade (RFC 9110 7.8).
            # httptools stops at the head: the body (Content-Length) is read here, the request answered over
            # HTTP/1.1, and the connection goes on with a parser of its own
            self.parser = httptools.HttpRequestParser(self)
            rest = data[e.args[0]:] if e.args and isinstance(e.args[0], int) else b""
            if self._upgrading is not None:
                self._upgrade_body(rest)
            elif rest:
                self.data_received(rest)
            return
        except httptools.HttpParserError as e:
            if not self._rejected:
                self._reject(400, f"Malformed HTTP request: {e}.", "bad_http")
            return
        if self._in_head:  # the read ended inside the head: httptools keeps a header whole until its line ends
            self._head_raw += len(data)  # (a header that never ends grew without bound, each read copying it again)
            if self._head_raw > _MAX_HEADER_BYTES + _READ_SLACK:
                self._reject(431, "Request headers are too large.", "headers_too_large")

    def pause_writing(self) -> None:
        self._paused_writing = True
        cur = self._current
        if cur is not None:
            if cur.producer is not None:
                cur.producer.pause()  # type: ignore[attr-defined]
            if self._due is None and self.transport is not None:  # its handler answering, nothing else timed:
                self._unsent = self.transport.get_write_buffer_size()  # the client must take some of it in time
                self._deadline(self.server.idle_timeout_s, self._write_stalled)

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self._due is not None and self._on_due == self._write_stalled:
            self._due = None  # taking again (a bound method each access: ==, not is)
        cur = self._current
        if cur is not None and cur.producer is not None:
            cur.producer.resume()  # type: ignore[attr-defined]
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None
        if cur is None and self.transport is not None:
            self._next()  # pipelined requests waited for the client to read what was answered

    async def drain(self) -> None:
        if self.transport is None:
            raise ConnectionResetError("client disconnected")
        if self._paused_writing:
            if self._drain is None:
                self._drain = self.loop.create_future()
            await self._drain

    def write(self, data: bytes) -> None:
        t = self.transport
        if t is not None:
            t.write(data)

    # -- httptools callbacks ------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.server.idle.pop(self, None)  # (a request arriving: not idle, never closed to make room)
        self._reset_message()
        self._in_head = self._in_message = True
        # the whole request (headers and body) must arrive in time: a slow-loris client is cut off with a 408
        self._deadline(self.server.request_timeout_s, self._read_timeout)

    def _read_timeout(self) -> None:
        s = self.server.request_timeout_s
        if self._current is not None or self._queue:  # the server is not reading it yet (serving the ones before)
            self._deadline(s, self._read_timeout)
            return
        self._reject(408, f"The request was not received completely within {s:g} s.", "request_timeout")

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_header(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            return  # a chunked body's trailer: never a request header (a front proxy checked the headers only)
        self._count_header(len(name) + len(value))
        key = name.decode("latin-1").lower()
        v = value.decode("latin-1")
        if key == "host":
            self._hosts += 1
        elif key in self._headers:
            if key == "transfer-encoding":  # one list over its lines (RFC 9110 5.3)
                v = self._headers[key] + ", " + v
            elif key == "authorization":  # a singleton (RFC 9110 11.6.2): which line a front proxy read is unknown
                self._reject(400, "A request must have one Authorization header, not several.", "invalid_authorization")
                return
            elif key.startswith("x-steersman-") and v != self._headers[key]:  # each takes one value (the last line
                # won: a deadline of 5000 then 1 ms read as 1 ms; a workflow id given twice, joined, would be a new
                # workflow's); the same value twice is the same request
                self._reject(400, f"A request must have one {key} header, not several.", "invalid_header")
                return
        self._headers[key] = v

    def _count_header(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > _MAX_HEADER_BYTES:
            self._reject(431, "Request headers are too large.", "headers_too_large")

    def on_headers_complete(self) -> None:
        self._in_head = False
        bad = _head_error(self.parser.get_http_version(), self._hosts, self._headers.get("transfer-encoding"))
        if bad is not None:
            self._reject(*bad)
            return
        length = self._headers.get("content-length")
        limit = self.server.max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            self._reject(413, f"Request body is larger than the limit of {limit} bytes.", "request_too_large")
            return
        # an interim answer only between responses (not inside the one being sent), and not to HTTP/1.0 clients
        if (self._headers.get("expect", "").lower() == "100-continue" and self._current is None and not self._queue
                and self.parser.get_http_version() != "1.0"):
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._rejected:
            return
        self._size += len(body)
        srv = self.server
        limit = srv.max_body_bytes
        if self._size > limit:
            self._reject(413, f"Request body is larger than the limit of {limit} bytes.", "request_too_large")
            return
        if srv.buffered + len(body) > srv.max_buffered_bytes:  # every connection's bodies at once: a global bound
            self._reject(503, "The gateway is receiving too many request bodies at once; retry shortly.",
                         "overloaded")
            return
        srv.buffered += len(body)
        self._held += len(body)
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._due = None  # the request is in: no deadline while its handler runs
        self._in_message = False
        self._release()  # (its body is the request's now, bounded by what the gateway admits)
        if self._rejected:
            return
        p = self.parser
        head = (p.get_method().decode("latin-1"), self._url, self._headers, p.should_keep_alive(),
                p.get_http_version() == "1.0")
        if p.should_upgrade():  # httptools did not read its body: data_received does
            length = self._headers.get("content-length", "0")
            if "transfer-encoding" in self._headers or not length.isdigit():
                self._reject(400, "An Upgrade request with a chunked body is not supported.", "unsupported_upgrade")
                return
            self._reset_message()
            self._upgrading = (*head, int(length))
            self._in_message = True
            self._deadline(self.server.request_timeout_s, self._read_timeout)
            return
        self._arrived(HttpRequest(self, head[0], head[1], head[2], b"".join(self._body), head[3], head[4]))

    def _upgrade_body(self, data: bytes) -> None:
        assert self._upgrading is not None
        method, url, headers, keep_alive, http10, length = self._upgrading
        buf = self._upgrade_buf + data
        if len(buf) < length:
            self._upgrade_buf = buf
            return
        self._upgrading, self._upgrade_buf = None, b""
        self._due = None
        self._in_message = False
        self._arrived(HttpRequest(self, method, url, headers, buf[:length], keep_alive, http10))
        if len(buf) > length:
            self.data_received(buf[length:])

    def _arrived(self, req: HttpRequest) -> None:
        self._reset_message()
        if self._current is None:
            self._start(req)
        else:
            self._queue.append(req)
            if len(self._queue) >= _MAX_PIPELINED and self.transport is not None:
                self.transport.pause_reading()

    # -- request lifecycle --------------------------------------------------------------
    def _start(self, req: HttpRequest) -> None:
        self._current = req
        self._task = self.loop.create_task(self.server.dispatch(req))

    def finished(self, req: HttpRequest, keep_alive: bool) -> None:
        """The response of ``req`` is complete: close, or serve the next queued request."""
        if req is not self._current:
            return
        self._current = None
        self._task = None
        t = self.transport
        if t is None:
            return
        if not keep_alive:
            t.close()
            if t.get_write_buffer_size():  # the close waits for the client to take the rest: not forever
                self._watch_unsent(t)
            return
        self._next()

    def _next(self) -> None:
        """Between responses: serve the next queued request, once the client has taken what was answered (a
        client sending requests and not reading the answers must not make the server buffer them all); or answer
        a protocol error that came after them; or wait, idle."""
        t = self.transport
        if self._queue:
            if self._paused_writing:
                self._watch_unsent(t)  # resume_writing comes back here, or the client stopped reading
                return
            if len(self._queue) == _MAX_PIPELINED and not self._rejected:
                t.resume_reading()
            self._start(self._queue.popleft())
        elif self._later is not None:
            status, message, code = self._later
            self._later = None
            self._rejected = False
            self._reject(status, message, code)
        elif not self._in_message:  # (a request being received keeps its read deadline)
            if self.server._refusing:  # draining (close_listener(idle_too=True)): idle now, so closed
                t.close()
                return
            self._arm_idle()

    def _reject(self, status: int, message: str, code: str) -> None:
        """Answer a protocol-level error, then close.

        The client may still be sending (a body over the limit): closing a socket
        with unread data would reset the connection before the client reads the
        error, so we half-close, discard what still arrives, and close when the
        client does (or after a grace period).
        """
        if self._rejected:
            return
        self._rejected = True
        self._release()
        self._body = []  # (what arrives after is discarded)
        t = self.transport
        if t is None:
            return
        if self._current is not None:  # the requests before it are answered first, in order (RFC 9112 9.3.2)
            self._later = (status, message, code)
            self._due = None
            t.pause_reading()
            return
        body = self.server.error_body(status, message, code)
        extra = self.server.error_extra(status, self._headers)
        if status == 503:  # (the body budget's overloaded: transient)
            extra += _OVERLOAD_RETRY_AFTER
        t.write(b"%bContent-Type: application/json\r\nContent-Length: %d\r\n%bConnection: close\r\n\r\n%b"
                % (_status_line(status), len(body), extra, body))
        if t.can_write_eof():
            t.write_eof()
        self.loop.call_later(_REJECT_GRACE_S, t.close)


def _head_error(version: str, hosts: int, coding: str | None) -> tuple[int, str, str] | None:
    """What RFC 9112 says a server must (or should) refuse in a request's head: another major version than 1 (505),
    an HTTP/1.1 request without exactly one Host (400, 3.2: "MUST respond with a 400"), or a transfer coding other
    than chunked (501, 6.1: a body gzipped under ``Transfer-Encoding: gzip, chunked`` was read as plain JSON)."""
    if version not in ("1.0", "1.1"):
        return 505, f"HTTP/{version} is not supported: send HTTP/1.1.", "http_version_not_supported"
    if version == "1.1" and hosts != 1:
        return 400, ("An HTTP/1.1 request must have a Host header." if not hosts
                     else "A request must have one Host header, not several."), "invalid_host"
    if coding is not None and coding.strip().lower() != "chunked":
        return 501, f"Transfer-Encoding {coding[:40]!r} is not supported: only chunked.", "unsupported_transfer_encoding"
    return None
