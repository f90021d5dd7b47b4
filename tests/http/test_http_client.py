"""The upstream client: pooling, stale-connection retry, streaming sink, failures."""

import asyncio
import contextlib

import pytest

from steersman.http.client import Endpoint, UpstreamError, UpstreamPool
from tests.gc_cycles import cyclic_garbage


class _Origin:
    """A tiny origin server whose behaviour per request is scripted."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.connections = 0
        self.requests = 0

    async def handle(self, r, w):
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
                await r.readexactly(length)
                self.requests += 1
                reply = self.replies.pop(0) if self.replies else b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                if reply == b"CLOSE":
                    w.close()
                    return
                w.write(reply)
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    async def start(self):
        self.srv = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return Endpoint.parse(f"http://127.0.0.1:{self.srv.sockets[0].getsockname()[1]}/base")


async def test_pool_reuses_keep_alive_connections():
    o = _Origin([])
    ep = await o.start()
    pool = UpstreamPool(2.0, 4.0)
    for _ in range(5):
        assert await pool.get(ep, "/x") == (200, b"ok")
    assert o.connections == 1 and o.requests == 5
    await pool.close()
    o.srv.close()


async def test_stale_idle_connection_is_retried_once_on_a_fresh_one():
    o = _Origin([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"CLOSE"])
    ep = await o.start()
    pool = UpstreamPool(2.0, 4.0)
    assert (await pool.get(ep, "/x"))[0] == 200
    assert (await pool.get(ep, "/x")) == (200, b"ok")  # first try hit a connection the origin closed
    assert o.connections == 2
    await pool.close()
    o.srv.close()


async def test_streaming_sink_gets_dechunked_bytes():
    body = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    o = _Origin([body])
    ep = await o.start()
    pool = UpstreamPool(2.0, 4.0)
    got = []
    ex = await pool.request(ep, b"POST", "/v1/x", b"{}")
    ex.pipe(got.append)
    await ex.done()
    assert b"".join(got) == b"hello world" and ex.complete
    await pool.close()
    o.srv.close()


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",  # then the origin hangs; we abort
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\n",  # malformed chunk size
    ],
)
async def test_broken_or_malformed_responses_raise(reply):
    o = _Origin([reply])
    ep = await o.start()
    pool = UpstreamPool(2.0, 4.0)
    ex = await pool.request(ep, b"POST", "/v1/x", b"{}")
    ex.abort()  # a hang is ended by its owner; a malformed reply fails by itself
    with pytest.raises(UpstreamError):
        await ex.done()
    await pool.close()
    o.srv.close()


async def test_connection_refused_is_not_connected():
    pool = UpstreamPool(2.0, 4.0)
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(UpstreamError) as e:
        await pool.get(Endpoint.parse(f"http://127.0.0.1:{port}"), "/")
    assert e.value.connected is False


async def test_sent_is_called_once_after_the_write_or_before_a_new_connection_opens():
    # the gateway flushes the prefix index then: after its request's bytes left, before it waits for the engine
    o = _Origin([])
    ep = await o.start()
    pool = UpstreamPool(2.0, 4.0)
    seen: list[tuple[int, int]] = []  # (connections, requests the origin had) when sent() ran
    sent = lambda: seen.append((o.connections, o.requests))  # noqa: E731
    ex = await pool.request(ep, b"POST", "/x", b"{}", b"", sent)  # no idle connection: before connecting
    assert seen == [(0, 0)] and ex.status == 200
    await ex.read()
    ex = await pool.request(ep, b"POST", "/x", b"{}", b"", sent)  # pooled: right after writing, before the head
    assert seen == [(0, 0), (1, 1)] and o.requests == 2 and ex.status == 200
    await ex.read()
    await pool.close()
    o.srv.close()


async def test_a_broken_exchange_leaves_no_reference_cycle():
    # an engine breaking a stream mid-response (the error raised from ``done()``), and one closing before its
    # headers on a fresh connection (raised from ``request()``): the futures hold the error, and the error, as
    # raised, held the frames holding the exchange: a cycle per failed request, left to the garbage collector
    from steersman.http.client import Exchange

    o = _Origin([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", b"CLOSE"])
    ep = await o.start()
    pool = UpstreamPool(2.0, 4.0)

    async def mid_stream():
        ex = await pool.request(ep, b"POST", "/v1/x", b"{}")
        got = []
        ex.pipe(got.append)
        await asyncio.sleep(0.05)
        ex.conn.transport.close()  # the engine's connection breaks before the response ends
        try:
            await ex.done()
        except UpstreamError as e:
            assert "closed" in str(e) and e.connected
        else:
            raise AssertionError("a broken response must raise")
        finally:
            ex.release()

    async def before_headers(pool):
        try:
            await pool.request(ep, b"POST", "/v1/x", b"{}")  # a fresh connection the origin closes: raised
        except UpstreamError as e:
            assert e.connected
        else:
            raise AssertionError("a connection closed before the headers must raise")

    await mid_stream()
    await pool.close()
    fresh = UpstreamPool(2.0, 4.0)  # (a closed pool connects no more)
    await asyncio.sleep(0.05)
    await before_headers(fresh)
    await asyncio.sleep(0.05)
    # only this test's objects: an earlier test's ``pytest.raises`` may leave its own cycle (its frame, held by
    # the traceback it keeps) to be collected now
    ours = lambda x: (isinstance(x, Exchange) and x.conn.pool in (pool, fresh)) or (  # noqa: E731
        isinstance(x, UpstreamError) and "engine closed the connection" in str(x))
    assert cyclic_garbage(ours) == {}
    await fresh.close()
    o.srv.close()


class _ClosingOrigin(_Origin):
    """Answers one request per connection, then closes it (llama-server after a streamed response, although it
    answers Keep-Alive); ``deaf_after``: connections past that many are closed before any request."""

    def __init__(self, deaf_after: int | None = None):
        super().__init__([])
        self.deaf_after = deaf_after

    async def handle(self, r, w):
        self.connections += 1
        if self.deaf_after is not None and self.connections > self.deaf_after:
            w.close()
            return
        try:
            head = await r.readuntil(b"\r\n\r\n")
            length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
            await r.readexactly(length)
            self.requests += 1
            w.write(b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        w.close()


async def _until(cond, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def _closing(preconnect: bool = True, deaf_after: int | None = None):
    o = _ClosingOrigin(deaf_after)
    ep = await o.start()
    pool = UpstreamPool(2.0, 4.0, preconnect=preconnect)
    try:
        yield o, ep, pool
    finally:
        await pool.close()
        o.srv.close()


async def _settled(pool: UpstreamPool) -> None:
    """Every connection gone, and a few turns of the loop in which a spare would have started."""
    await _until(lambda: not pool._all)
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_closed_connection_that_served_is_replaced_by_a_spare_before_the_next_request():
    async with _closing() as (o, ep, pool):
        for k in range(1, 4):
            assert await pool.get(ep, "/x") == (200, b"ok")
            await _until(lambda: pool.spares_opened == k)  # the origin closed it: a spare is connected at once
            assert o.connections == k + 1  # ... before any request needs it
        assert o.requests == 3  # each request after the first went out on the spare


async def test_a_request_waits_for_the_spare_being_opened_rather_than_connecting_again():
    async with _closing() as (o, ep, pool):
        assert await pool.get(ep, "/x") == (200, b"ok")
        while not pool._spares:  # the origin's close asked for a spare: catch it while it connects
            await asyncio.sleep(0)
        assert pool.spares_opened == 0
        assert await pool.get(ep, "/x") == (200, b"ok")
        await _until(lambda: pool.spares_opened == 2)
        assert o.connections == 3  # the first, the spare the second request used, the spare after it: none extra


async def test_a_spare_the_engine_closes_unused_is_not_replaced():
    async with _closing(deaf_after=2) as (o, ep, pool):  # the second connection (a spare) is served, the third not
        assert await pool.get(ep, "/x") == (200, b"ok")
        await _until(lambda: pool.spares_opened == 1)
        assert await pool.get(ep, "/x") == (200, b"ok")  # on the spare
        await _until(lambda: o.connections == 3)  # the next spare, which the origin closes at once
        await _settled(pool)
        assert o.connections == 3 and not pool._spares  # no reconnect loop


async def test_no_spare_without_preconnect():
    async with _closing(preconnect=False) as (o, ep, pool):
        assert await pool.get(ep, "/x") == (200, b"ok")
        await _settled(pool)
        assert o.connections == 1 and pool.spares_opened == 0


async def test_a_connection_a_slow_client_paused_reads_again_once_pooled():
    # the relay writes the response's last bytes to the client inside this connection's read; a client whose
    # buffer is full pauses reading here (Exchange.pause) and the relay lets go of the exchange right after:
    # pooled still paused, the next request on it never saw its answer
    o = _Origin([])
    ep = await o.start()
    pool = UpstreamPool(2.0, 4.0)
    ex = await pool.request(ep, b"POST", "/x", b"{}")
    ex.pipe(lambda data: ex.pause())  # the client's pause_writing during the last write
    await ex.done()
    ex.release()
    assert ex.conn.transport.is_reading()
    ex.pause()  # a late pause from the finished stream's client touches nothing: the connection is the pool's
    assert ex.conn.transport.is_reading()
    async with asyncio.timeout(2):
        assert await pool.get(ep, "/x") == (200, b"ok")
    assert o.connections == 1 and o.requests == 2
    await pool.close()
    o.srv.close()


@contextlib.asynccontextmanager
async def _stalled_spare():
    """A closing origin whose next connect (the spare after the first request) waits on the returned future."""
    async with _closing() as (o, ep, pool):
        real, gate, calls = pool._connect, asyncio.get_running_loop().create_future(), []

        async def connect(ep_, key):
            calls.append(key)
            if len(calls) == 1:
                await gate
            return await real(ep_, key)

        ex = await pool.request(ep, b"POST", "/x", b"{}")
        pool._connect = connect  # from the spare its close asks for on
        assert await ex.read() == b"ok"
        await _until(lambda: bool(calls))  # the origin closed it: the spare is connecting (held at the gate)
        yield o, ep, pool, gate, calls


async def test_a_request_waiting_for_a_spare_whose_connect_fails_fails_with_it():
    # its connect was the spare's: connecting once more would double its wait before the replica is marked down
    async with _stalled_spare() as (o, ep, pool, gate, calls):
        waiting = asyncio.ensure_future(pool.get(ep, "/x"))
        await asyncio.sleep(0.01)
        gate.set_exception(UpstreamError("cannot connect to the engine: TimeoutError", connected=False))
        with pytest.raises(UpstreamError) as e:
            await waiting
        assert e.value.connected is False and "TimeoutError" in str(e.value)
        assert len(calls) == 1 and o.connections == 1


async def test_closing_the_pool_while_a_request_waits_for_a_spare_leaves_no_connection_open():
    async with _stalled_spare() as (o, ep, pool, gate, calls):
        waiting = asyncio.ensure_future(pool.get(ep, "/x"))
        await asyncio.sleep(0.01)
        await pool.close()
        with pytest.raises(UpstreamError):
            await waiting
        assert not pool._all and not pool._idle.get((ep.host, ep.port, ep.tls))


async def test_a_connect_finishing_after_the_pool_closed_is_closed_too():
    o = _Origin([])
    ep = await o.start()
    pool = UpstreamPool(2.0, 4.0)
    connecting = asyncio.ensure_future(pool.get(ep, "/x"))
    await asyncio.sleep(0)  # the connect has begun
    await pool.close()
    with pytest.raises(UpstreamError):
        await connecting
    assert not pool._all
    o.srv.close()


async def test_a_connect_timeout_names_itself():
    pool = UpstreamPool(1e-9, 4.0)
    with pytest.raises(UpstreamError) as e:
        await pool.get(Endpoint.parse("http://127.0.0.1:9"), "/")
    assert "TimeoutError" in str(e.value) or "refused" in str(e.value).lower()
