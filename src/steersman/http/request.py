"""One request of :mod:`steersman.http.server` and how its response is written (whole, or streamed chunk by chunk)."""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from steersman.http._connection import _Connection

__all__ = ["HttpRequest"]

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


def _status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))


class HttpRequest:
    """One request; the handler answers with :meth:`respond` or :meth:`start_stream` ... :meth:`end_stream`."""

    __slots__ = ("conn", "method", "path", "query", "headers", "body", "keep_alive", "http10", "_state", "_held",
                 "producer", "head_only", "extra_headers")

    def __init__(self, conn: _Connection, method: str, url: bytes, headers: dict[str, str], body: bytes, keep_alive: bool, http10: bool) -> None:
        self.conn = conn
        self.method = method
        if url[:1] != b"/" and b"://" in url[:10]:  # absolute-form (RFC 9112 3.2.2): what a proxy-minded client sends
            url = b"/" + url.split(b"://", 1)[1].partition(b"/")[2]
        path, _, query = url.partition(b"?")
        self.path = path.decode("latin-1")
        self.query = query.decode("latin-1")
        self.headers = headers  # lower-case names
        self.body = body
        self.keep_alive = keep_alive
        self.http10 = http10
        self._state = 0  # 0 nothing sent, 1 streaming, 2 done
        self._held = b""  # a held stream head: written with the first body bytes (one write, not two)
        self.producer: object | None = None  # has pause()/resume(): paused while the client can't keep up
        self.head_only = False  # a HEAD request served by a GET handler: its whole responses go without a body
        self.extra_headers = b""  # header lines (each ending in CRLF) every response to it carries (X-Request-Id)

    @property
    def started(self) -> bool:
        return self._state != 0

    @property
    def client_paused(self) -> bool:
        """The client's connection cannot take more now (its producer is paused until it drains)."""
        return self.conn._paused_writing

    @property
    def closed(self) -> bool:
        return self.conn.transport is None or self.conn.transport.is_closing()

    def respond(self, status: int, body: bytes, content_type: bytes = b"application/json", extra: bytes = b"") -> None:
        """A whole response. ``extra`` is pre-encoded header lines, each ending in CRLF."""
        if self._state:
            raise RuntimeError("response already started")
        self._state = 2
        ka = self.keep_alive
        head = b"%bContent-Type: %b\r\nContent-Length: %d\r\n%b%b%b\r\n" % (
            _status_line(status), content_type, len(body), extra, self.extra_headers,
            (b"Connection: keep-alive\r\n" if self.http10 else b"") if ka else b"Connection: close\r\n")
        self.conn.write(head if self.head_only else head + body)
        self.conn.finished(self, ka)

    def start_stream(self, status: int = 200, content_type: bytes = b"text/event-stream", extra: bytes = b"",
                     hold: bool = False) -> None:
        """Start a streamed response; ``hold``: its head goes out with the first body bytes (one write, not two)."""
        if self._state:
            raise RuntimeError("response already started")
        self._state = 1
        extra += self.extra_headers
        if self.http10:
            self.keep_alive = False
            head = b"%bContent-Type: %b\r\nCache-Control: no-cache\r\n%bConnection: close\r\n\r\n" % (_status_line(status), content_type, extra)
        else:
            head = b"%bContent-Type: %b\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n%b%b\r\n" % (
                _status_line(status), content_type, extra, b"" if self.keep_alive else b"Connection: close\r\n")
        if hold:
            self._held = head
        else:
            self.conn.write(head)

    def withdraw(self) -> bool:
        """Take back a stream whose held head has not been written (no byte reached the client): a whole
        response may follow, with its own status.  False when the stream is on the wire (or not started)."""
        if self._state == 1 and self._held:
            self._state, self._held = 0, b""
            return True
        return False

    def send(self, data: bytes, last: bool = False) -> None:
        """One piece of a streamed body, written now (no buffering, no await); ``last``: it also ends the stream.

        Nothing is written once the stream ended (a late error event cannot corrupt a kept-alive connection).
        """
        if self._state != 1 or not (data or last):
            return
        out = data if self.http10 or not data else b"%x\r\n%b\r\n" % (len(data), data)
        if self._held:
            out = self._held + out
            self._held = b""
        if last:
            self._state = 2
            if not self.http10:
                out += b"0\r\n\r\n"
        if out:
            self.conn.write(out)
        if last:
            self.conn.finished(self, self.keep_alive)

    def end_stream(self) -> None:
        self.send(b"", True)

    async def drain(self) -> None:
        """Wait while the client's socket buffer is full (backpressure for awaiting writers)."""
        await self.conn.drain()
