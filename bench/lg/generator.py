"""The closed loop: `concurrency` connections, each with one streaming request in flight."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

from lg.bodies import chat_body, dumps
from lg.raw import RawConn
from lg.records import Record, RunResult, cpu_self

_ns = time.perf_counter_ns


class LoadGen:
    """Closed-loop generator: `concurrency` connections, each with one request in flight."""

    def __init__(self, url: str | list[str], concurrency: int, body: dict | bytes | None = None, *,
                 client: str = "raw", timeout: float = 30.0, headers: dict | None = None, quickack: bool = False):
        # several URLs: connection i talks to urls[i % n] (the even spread of a free, perfect round-robin
        # router; bench/overhead's ``direct`` reference over every engine)
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("give at least one URL")
        self.url = urls[0]
        self.concurrency = concurrency
        self.client = client
        self.timeout = timeout
        # Diagnostic only: ACK every read at once (TCP_QUICKACK), which hides a server's Nagle +
        # delayed-ACK stall (see bench/PEERS.md, sglang-router). Real clients do not do this.
        self.quickack = quickack
        self.body = body if isinstance(body, bytes) else dumps(body if body is not None else chat_body())
        self.targets = [self._target(u, headers) for u in urls]
        if client == "aiohttp" and len(urls) > 1:
            raise ValueError("the aiohttp client takes one URL")
        self.host, self.port, self.path, self.headers, self.request_bytes = self.targets[0]
        self.loop: asyncio.AbstractEventLoop | None = None
        self.conns: list = []
        self._session = None
        # per-run state
        self._records: list = []
        self._deadline_ns = 0
        self._left = 0
        self._active = 0
        self._finished: asyncio.Future | None = None

    def _target(self, url: str, headers: dict | None) -> tuple[str, int, str, dict, bytes]:
        u = urlsplit(url)
        if u.scheme != "http":
            raise ValueError("only http:// URLs are supported")
        host, port = u.hostname or "127.0.0.1", u.port or 80
        path = (u.path or "/") + (("?" + u.query) if u.query else "")
        hdrs = {"Host": f"{host}:{port}", "Content-Type": "application/json", "Accept": "text/event-stream",
                "Content-Length": str(len(self.body))}
        hdrs.update(headers or {})
        raw = (f"POST {path} HTTP/1.1\r\n".encode() + b"".join(f"{k}: {v}\r\n".encode() for k, v in hdrs.items())
               + b"\r\n" + self.body)
        return host, port, path, hdrs, raw

    # ---- connections
    async def connect(self):
        self.loop = asyncio.get_running_loop()
        if self.client == "aiohttp":
            from lg import aiohttp_client

            self._session = aiohttp_client.open_session(self.concurrency, self.timeout)
            return
        # open all connections up front (in batches, to spare the listener's backlog)
        for i in range(0, self.concurrency, 64):
            batch = [self._open(j % len(self.targets)) for j in range(i, min(i + 64, self.concurrency))]
            self.conns.extend(await asyncio.gather(*batch))

    async def _open(self, target: int = 0) -> RawConn:
        host, port, _, _, raw = self.targets[target]
        _, proto = await self.loop.create_connection(lambda: RawConn(self, target, raw), host, port)
        await proto.connected
        return proto

    async def close(self):
        for c in self.conns:
            if c.tr is not None and not c.closed:
                c.tr.close()
        self.conns = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ---- running
    async def run(self, *, requests: int | None = None, duration: float | None = None) -> RunResult:
        """Run until `requests` have been issued or `duration` seconds passed; wait for in-flight ones."""
        if requests is None and duration is None:
            raise ValueError("give requests= or duration=")
        if self.loop is None:
            await self.connect()
        self._records = []
        self._left = requests if requests is not None else 1 << 62
        cpu0 = cpu_self()
        t0 = _ns()
        self._deadline_ns = t0 + int(duration * 1e9) if duration is not None else 1 << 62
        if self.client == "aiohttp":
            from lg import aiohttp_client

            await asyncio.gather(*(aiohttp_client.worker(self) for _ in range(self.concurrency)))
        else:
            self._finished = self.loop.create_future()
            self._active = 0
            for c in list(self.conns):
                self._issue(c)
            if self._active:
                await self._finished
        wall = (_ns() - t0) / 1e9
        cpu = cpu_self() - cpu0
        return RunResult(self._records, wall, self.concurrency, cpu)

    def _issue(self, conn: RawConn) -> bool:
        """Start the next request on `conn` (or on a replacement if it was closed); False when done."""
        if self._left <= 0 or _ns() >= self._deadline_ns:
            return False
        self._active += 1
        if conn.closed or conn.tr is None or conn.tr.is_closing():
            # the server closed it (Connection: close, idle timeout, error): reconnect, then send
            try:
                self.conns.remove(conn)
            except ValueError:
                pass
            self.loop.create_task(self._reconnect_and_issue(conn.target))
            return True
        self._left -= 1
        conn.send(Record(0))
        return True

    def _check_finished(self):
        if self._active == 0 and self._finished is not None and not self._finished.done():
            self._finished.set_result(None)

    def _done(self, conn: RawConn, rec: Record):
        self._records.append(rec)
        self._active -= 1
        if not self._issue(conn):
            self._check_finished()

    async def _reconnect_and_issue(self, target: int = 0):
        # the caller counted this slot in _active already
        try:
            c = await self._open(target)
        except OSError as e:
            self._left -= 1  # a failed connect counts as a failed request
            self._records.append(Record(_ns(), status=0, error=f"connect: {e!r}"))
            await asyncio.sleep(0.05)
            if self._left > 0 and _ns() < self._deadline_ns:
                self.loop.create_task(self._reconnect_and_issue(target))
            else:
                self._active -= 1
                self._check_finished()
            return
        self.conns.append(c)
        self._active -= 1
        if not self._issue(c):
            self._check_finished()
