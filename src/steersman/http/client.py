"""The gateway's HTTP/1.1 client towards engines: pooled keep-alive connections, httptools parsing.

A response body is handed to a callback from ``data_received`` as it arrives
(:meth:`Exchange.pipe`), so relaying a stream costs no await per chunk.  A
connection is returned to its pool when its response completed and both sides
keep it alive; a reused connection that the engine had already closed is
retried once on a fresh one (nothing had reached the engine's application).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from steersman.config import DEFAULTS

__all__ = ["UpstreamError", "Endpoint", "Exchange", "UpstreamPool"]

log = logging.getLogger(__name__)


class UpstreamError(Exception):
    """The engine could not be reached, or broke the connection.

    ``connected`` is False when nothing reached the engine (refused, unreachable,
    connect timeout): always safe to retry elsewhere.
    """

    def __init__(self, message: str, connected: bool) -> None:
        super().__init__(message)
        self.connected = connected


def _detached(e: UpstreamError) -> UpstreamError:
    """What to raise for ``e``, an exchange's failure that its futures hold: a copy.  ``e`` itself, raised,
    would take a traceback of the frames it passes through, and those hold the exchange that holds the
    futures that hold ``e``: a reference cycle per failed request, left to the garbage collector."""
    e.__traceback__ = None
    return UpstreamError(str(e), e.connected)


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    tls: bool
    base_path: str
    host_header: bytes

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = u.scheme == "https"
        port = u.port or (443 if tls else 80)
        return cls(u.hostname, port, tls, u.path.rstrip("/"), u.netloc.encode("idna"))


class Exchange:
    """One request/response on one connection."""

    __slots__ = ("conn", "status", "_raw_headers", "_headers", "_head", "_done", "_buf", "_sink", "complete", "got_bytes",
                 "last")

    def __init__(self, conn: _UpConn) -> None:
        loop = conn.loop
        self.conn = conn
        self.status = 0
        self._raw_headers: list[bytes] = []  # name, value, name, value, ...: decoded only if someone asks
        self._headers: dict[str, str] | None = None
        self._head: asyncio.Future = loop.create_future()
        self._done: asyncio.Future = loop.create_future()
        self._buf: list[bytes] = []
        self._sink: Callable[[bytes], None] | None = None
        self.complete = False
        self.got_bytes = False
        self.last = False  # the sink is being handed the response's last body bytes (the message is complete)

    @property
    def headers(self) -> dict[str, str]:
        """The response headers, lower-case names (the relay never reads them: built on first use)."""
        if self._headers is None:
            raw = self._raw_headers
            self._headers = {raw[k].decode("latin-1").lower(): raw[k + 1].decode("latin-1") for k in range(0, len(raw), 2)}
        return self._headers

    def pipe(self, sink: Callable[[bytes], None]) -> None:
        """Deliver body bytes to ``sink`` as they arrive (buffered ones first, as one piece)."""
        buf, self._buf = self._buf, []
        self._sink = sink
        if buf:
            self.last = self.complete
            sink(buf[0] if len(buf) == 1 else b"".join(buf))

    async def done(self) -> None:
        """Wait for the end of the response; raises :class:`UpstreamError` if it broke.

        Cancelling the waiter cancels ``_done``; the connection then only skips
        resolving it (every resolver checks ``done()`` first).
        """
        try:
            await self._done
        except UpstreamError as e:
            raise _detached(e) from None

    async def read(self) -> bytes:
        await self.done()
        return b"".join(self._buf)

    def pause(self) -> None:
        """Backpressure from the client: stop reading the engine's answer (nothing once it is complete: the
        connection then belongs to the pool, or to the next request)."""
        t = self.conn.transport
        if t is not None and not self.complete:
            t.pause_reading()

    def resume(self) -> None:
        t = self.conn.transport
        if t is not None and not self.complete:
            t.resume_reading()

    def abort(self) -> None:
        """Drop the connection; the engine sees the client go and cancels the request."""
        if not self.complete:
            self.conn.close()

    def release(self) -> None:
        """The caller is done with this exchange: abort it if unfinished and drop its sink.

        The sink (a relay) usually holds the request's context, which holds the client request whose
        producer is this exchange: a reference cycle per request.  Left in place, every request's
        objects (~17) outlived it as cyclic garbage, and the collector's passes over them cost ~5% of
        the gateway's CPU at 64 streams with pauses up to ~36 ms, a stall of every stream in flight.
        """
        self.abort()
        self._sink = None

    # -- from the connection ------------------------------------------------------------
    def _fail(self, err: Exception) -> None:
        for f in (self._head, self._done):
            if not f.done():
                f.set_exception(err)
                f.exception()  # mark retrieved: not every caller awaits both futures


class _UpConn(asyncio.Protocol):
    __slots__ = ("pool", "key", "ep", "loop", "transport", "parser", "exchange", "reused", "idle_since", "served",
                 "_batch")

    def __init__(self, pool: UpstreamPool, key: tuple, ep: Endpoint) -> None:
        self.pool = pool
        self.key = key
        self.ep = ep
        self.served = False  # a response completed on it (its close then asks for a spare: UpstreamPool.preconnect)
        self.loop = asyncio.get_running_loop()  # made by the loop's protocol factory; a lookup costs a getpid
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None  # made once connected: it references this protocol,
        # a cycle that connection_lost breaks (a connection that never came up gets neither)
        self.exchange: Exchange | None = None
        self.reused = False
        self.idle_since = 0.0
        self._batch: list[bytes] = []  # body pieces of one read, handed to the sink together

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.parser = httptools.HttpResponseParser(self)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.parser = None  # it references this protocol: a cycle otherwise
        self.pool._forget(self)
        ex = self.exchange
        if ex is not None and not ex.complete:
            self.exchange = None
            ex._fail(UpstreamError(f"engine closed the connection ({exc or 'EOF'})", connected=True))

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:
            self.close()  # bytes nobody asked for: the connection is unusable
            return
        ex.got_bytes = True
        try:
            self.parser.feed_data(data)  # type: ignore[union-attr]
        except httptools.HttpParserError as e:
            self._batch.clear()
            self.exchange = None
            if isinstance(e, httptools.HttpParserCallbackError) and e.__context__ is not None:
                # not the engine's bytes: the sink (a relay) raised while it was handed them (a bug to see)
                log.error("a response's sink failed", exc_info=e.__context__)
            ex._fail(UpstreamError(f"malformed HTTP response from engine: {e}", connected=True))
            self.close()
            return
        if self._batch:
            self._flush(ex)

    def _flush(self, ex: Exchange) -> None:
        """Everything one read carried goes to the sink as one piece (one client write, not one per chunk)."""
        batch = self._batch
        data = batch[0] if len(batch) == 1 else b"".join(batch)
        batch.clear()
        ex._sink(data)  # type: ignore[misc]

    def on_header(self, name: bytes, value: bytes) -> None:
        self.exchange._raw_headers += (name, value)  # type: ignore[union-attr]

    def on_headers_complete(self) -> None:
        ex = self.exchange
        ex.status = self.parser.get_status_code()  # type: ignore[union-attr]
        if not ex._head.done():  # type: ignore[union-attr]
            ex._head.set_result(None)  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        ex = self.exchange
        if ex._sink is None:  # type: ignore[union-attr]
            ex._buf.append(body)  # type: ignore[union-attr]
        else:
            self._batch.append(body)

    def on_message_complete(self) -> None:
        ex = self.exchange
        if self._batch:
            ex.last = True  # type: ignore[union-attr]
            self._flush(ex)  # the last bytes reach the sink before the response counts as done
        self.exchange = None
        self.served = True
        keep = self.parser.should_keep_alive()  # type: ignore[union-attr]
        self.parser = httptools.HttpResponseParser(self)
        ex.complete = True  # type: ignore[union-attr]
        if not ex._done.done():  # type: ignore[union-attr]
            ex._done.set_result(None)  # type: ignore[union-attr]
        if keep:
            # the last read's write to a slow client may have paused reading here (Exchange.pause); the relay
            # lets go of the exchange now, so nothing would resume it: a pooled connection must read (its next
            # response, or the engine closing it)
            t = self.transport
            if t is not None and not t.is_reading():
                t.resume_reading()
            self.pool._release(self)
        else:
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class UpstreamPool:
    """Keep-alive connections per endpoint, most recently used first.

    ``preconnect`` (``GatewaySettings.upstream_preconnect``): when a connection that served a response closes (the
    engine closed it after the response, or later for idling; the gateway aborted a later exchange on it), a spare
    is opened at once, so the next request finds one ready; a request arriving while the spare is being connected
    waits for it rather than connecting again, and fails with it if its connect fails (it was that request's
    connect).  A spare the engine closes unused is not replaced (no reconnect loop against an engine that closes
    idle connections).  A closed pool connects no more."""

    def __init__(self, connect_timeout_s: float, idle_timeout_s: float,
                 preconnect: bool = DEFAULTS.gateway.upstream_preconnect) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.preconnect = preconnect
        self._idle: dict[tuple, list[_UpConn]] = {}
        self._all: set[_UpConn] = set()
        self._ssl: ssl.SSLContext | None = None
        self._spares: dict[tuple, asyncio.Task] = {}  # endpoint key -> a spare connection being opened
        self._closed = False
        self.spares_opened = 0

    async def _connect(self, ep: Endpoint, key: tuple) -> _UpConn:
        loop = asyncio.get_running_loop()
        ctx = None
        if ep.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the connect in a task of its own, and a
            # failed connect's error then held that task in a reference cycle (through wait_for's frame), one
            # per attempt at a dead engine (the scraper tries every metrics interval)
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(lambda: _UpConn(self, key, ep), ep.host, ep.port, ssl=ctx)
        except (OSError, TimeoutError, ssl.SSLError) as e:
            raise UpstreamError(f"cannot connect to {ep.host}:{ep.port}: {str(e) or type(e).__name__}",
                                connected=False) from None
        if self._closed:  # closed while connecting: nothing may outlive the pool
            conn.close()
            raise UpstreamError(f"cannot connect to {ep.host}:{ep.port}: the gateway is stopping", connected=False)
        self._all.add(conn)
        return conn

    def _acquire_idle(self, key: tuple) -> _UpConn | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = idle[-1].loop.time()
        while idle:
            conn = idle.pop()
            if conn.transport is not None and now - conn.idle_since < self.idle_timeout_s:
                conn.reused = True
                return conn
            conn.served = False  # closed here for idling: no spare for it
            conn.close()
        return None

    def _release(self, conn: _UpConn) -> None:
        if conn.transport is None:
            return
        conn.idle_since = conn.loop.time()
        self._idle.setdefault(conn.key, []).append(conn)

    def _forget(self, conn: _UpConn) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)
        if conn.served and self.preconnect and not self._closed:
            self._spare(conn.ep, conn.key)

    def _spare(self, ep: Endpoint, key: tuple) -> None:
        if key in self._spares or self._idle.get(key):
            return
        self._spares[key] = asyncio.get_running_loop().create_task(self._open_spare(ep, key), name="upstream-spare")

    async def _open_spare(self, ep: Endpoint, key: tuple) -> UpstreamError | None:
        """Connect a spare and pool it; a failed connect is returned (not raised: nobody may be waiting for it)."""
        try:
            conn = await self._connect(ep, key)
        except UpstreamError as e:
            return e  # the engine is down: a request waiting for the spare fails with it, the health checks see it
        finally:
            self._spares.pop(key, None)
        self.spares_opened += 1
        self._release(conn)
        return None

    async def _spare_or_none(self, key: tuple) -> _UpConn | None:
        """The spare being opened for ``key``, once connected (None if there is none, or another request took it).

        Raises the spare's :class:`UpstreamError` if its connect failed: that was this request's connect (begun
        earlier), and connecting again would make it wait up to twice ``connect_timeout_s`` before the gateway
        marks the engine down and retries elsewhere."""
        task = self._spares.get(key)
        if task is None:
            return None
        try:
            failed = await asyncio.shield(task)  # (a request cancelled meanwhile leaves the spare to the next)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if not task.cancelled() or (me is not None and me.cancelling()):
                raise  # this request was cancelled, not (only) the spare
            raise UpstreamError("the gateway is stopping", connected=False) from None  # the pool is closing
        if failed is not None:
            raise UpstreamError(str(failed), connected=False)
        return self._acquire_idle(key)

    async def request(self, ep: Endpoint, method: bytes, path: str, body: bytes = b"", headers: bytes = b"",
                      sent: Callable[[], None] | None = None) -> Exchange:
        """Send a request and wait for the response headers.

        ``headers`` are extra pre-encoded header lines ending in CRLF.  ``sent`` is called once: right after
        the request is written, or before waiting for a new connection when no idle one is pooled.
        """
        key = (ep.host, ep.port, ep.tls)
        head = b"%b %b HTTP/1.1\r\nHost: %b\r\nContent-Length: %d\r\n%b\r\n" % (
            method, (ep.base_path + path).encode("latin-1"), ep.host_header, len(body), headers)
        data = head + body
        for attempt in (0, 1):
            conn = self._acquire_idle(key) if attempt == 0 else None
            if conn is None:
                if sent is not None:
                    sent, then = None, sent
                    then()
                if self._spares:  # (a stale connection's close asked for one: the retry takes it)
                    conn = await self._spare_or_none(key)
                if conn is None:
                    conn = await self._connect(ep, key)
            ex = Exchange(conn)
            conn.exchange = ex
            conn.transport.write(data)  # type: ignore[union-attr]
            if sent is not None:
                sent, then = None, sent
                then()
            try:
                await ex._head
                return ex
            except UpstreamError as e:
                if attempt == 0 and conn.reused and not ex.got_bytes:
                    e.__traceback__ = None
                    continue  # the engine had closed this idle connection: once more on a fresh one
                raise _detached(e) from None
            except asyncio.CancelledError:
                ex.abort()
                raise
        raise AssertionError("unreachable")

    async def get(self, ep: Endpoint, path: str) -> tuple[int, bytes]:
        ex = await self.request(ep, b"GET", path)
        try:
            return ex.status, await ex.read()
        finally:
            ex.abort()

    async def close(self) -> None:
        self._closed = True
        for task in list(self._spares.values()):
            task.cancel()
        for conn in list(self._all):
            conn.close()
        self._idle.clear()
