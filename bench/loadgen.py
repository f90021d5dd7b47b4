#!/usr/bin/env python3
"""Closed-loop streaming load generator for OpenAI-compatible servers.

Keeps C streaming requests in flight (one keep-alive connection per stream)
against one URL, for a number of requests or a duration, and records per
request: TTFT (request written -> first SSE ``data:`` event that carries
content), every inter-chunk gap after that, end-to-end time, HTTP status and
bytes received. ``summarize()`` gives p50/p90/p99 of each.

Two client implementations:

* ``raw`` (default): an asyncio ``Protocol`` per connection with a minimal
  HTTP/1.1 response parser (chunked or Content-Length) and an SSE scanner,
  driven by callbacks (no task or future per request). Timestamps are taken
  at the top of ``data_received``. TCP_NODELAY is set explicitly.
* ``aiohttp``: ``aiohttp.ClientSession`` + one task per stream, reading
  ``resp.content`` as it arrives. aiohttp sets TCP_NODELAY on every
  connection (``aiohttp.base_protocol.BaseProtocol.connection_made``).

The raw client costs several times less CPU per request than aiohttp (run
``python bench/loadgen.py --compare`` against a stub engine to see), so it
is the one used for the overhead benchmark; aiohttp is kept as a cross-check.

Library use::

    lg = LoadGen("http://127.0.0.1:9001/v1/chat/completions", concurrency=64,
                 body=chat_body(max_tokens=16))
    await lg.connect()
    await lg.run(duration=1.0)             # warm-up, discarded
    res = await lg.run(duration=8.0)       # measured
    print(res.summary())
    await lg.close()

CLI::

    python bench/loadgen.py --url http://127.0.0.1:9001/v1/chat/completions -c 64 -d 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import resource
import socket
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

try:
    import orjson

    def _dumps(o) -> bytes:
        return orjson.dumps(o)
except ImportError:  # pragma: no cover

    def _dumps(o) -> bytes:
        return json.dumps(o, separators=(",", ":")).encode()


_ns = time.perf_counter_ns

# An SSE data event that carries generated text: "content":"x… or "text":"x… (any JSON spacing).
_CONTENT_RE = re.compile(rb'"(?:content|text)"\s*:\s*"[^"]')


def chat_body(model: str = "llama-3.1-8b", max_tokens: int = 16, prompt: str = "Say hello.", **extra) -> dict:
    b = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True, "max_tokens": max_tokens}
    b.update(extra)
    return b


def completion_body(model: str = "llama-3.1-8b", max_tokens: int = 16, prompt: str = "Say hello.", **extra) -> dict:
    b = {"model": model, "prompt": prompt, "stream": True, "max_tokens": max_tokens}
    b.update(extra)
    return b


# --------------------------------------------------------------------------- records


@dataclass(slots=True)
class Record:
    start_ns: int  # perf_counter_ns when the request was written
    ttft_ns: int = -1  # -1: no content event seen
    e2e_ns: int = -1
    status: int = 0  # HTTP status; 0 = connection error / no response; -1 = timeout
    nbytes: int = 0  # response bytes on the wire (head + body)
    chunks: int = 0  # data events with content or after the first content (excl. [DONE])
    done: bool = False  # saw "data: [DONE]"
    gaps_ns: list = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.ttft_ns >= 0 and self.e2e_ns >= 0


def percentile(sorted_vals, q: float) -> float:
    """Nearest-rank-with-interpolation percentile of an already sorted sequence."""
    n = len(sorted_vals)
    if n == 0:
        return float("nan")
    if n == 1:
        return float(sorted_vals[0])
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return float(sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo))


def dist_ms(vals_ns) -> dict:
    """p50/p90/p99/mean/max in milliseconds of a list of nanosecond values."""
    v = sorted(vals_ns)
    if not v:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "mean": None, "max": None}
    return {
        "n": len(v),
        "p50": percentile(v, 50) / 1e6,
        "p90": percentile(v, 90) / 1e6,
        "p99": percentile(v, 99) / 1e6,
        "mean": sum(v) / len(v) / 1e6,
        "max": v[-1] / 1e6,
    }


@dataclass
class RunResult:
    records: list
    wall_s: float
    concurrency: int
    client_cpu_s: float  # CPU (user+sys) of this process during the run

    def summary(self) -> dict:
        recs = self.records
        ok = [r for r in recs if r.ok]
        gaps = [g for r in ok for g in r.gaps_ns]
        statuses: dict = {}
        for r in recs:
            k = str(r.status) if r.ok or r.status != 200 else "200-incomplete"
            statuses[k] = statuses.get(k, 0) + 1
        n = len(recs)
        return {
            "requests": n,
            "ok": len(ok),
            "errors": n - len(ok),
            "statuses": statuses,
            "first_error": next((r.error for r in recs if not r.ok and r.error), ""),
            "wall_s": self.wall_s,
            "rps": len(ok) / self.wall_s if self.wall_s > 0 else 0.0,
            "concurrency": self.concurrency,
            "ttft_ms": dist_ms([r.ttft_ns for r in ok]),
            "itl_ms": dist_ms(gaps),
            "e2e_ms": dist_ms([r.e2e_ns for r in ok]),
            "chunks_per_req": (sum(r.chunks for r in ok) / len(ok)) if ok else 0.0,
            "bytes_per_req": (sum(r.nbytes for r in ok) / len(ok)) if ok else 0.0,
            "client_cpu_s": self.client_cpu_s,
            "client_cpu_us_per_req": (self.client_cpu_s * 1e6 / n) if n else None,
            "client_cpu_util": self.client_cpu_s / self.wall_s if self.wall_s > 0 else 0.0,
        }


def _cpu_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# --------------------------------------------------------------------------- raw client

_H_START, _H_BODY_CHUNKED, _H_BODY_LEN, _H_BODY_EOF = 0, 1, 2, 3


class _RawConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection issuing one streaming request at a time."""

    def __init__(self, gen: LoadGen):
        self.gen = gen
        self.tr = None
        self.connected = gen.loop.create_future()
        self.rec: Record | None = None
        self.closed = False
        self.sock = None
        self._reset_parser()

    def _reset_parser(self):
        self.state = _H_START
        self.hbuf = b""
        self.cbuf = b""  # chunked framing buffer
        self.left = 0  # bytes left in current chunk (chunked) or body (length)
        self.sse = b""  # SSE text not yet split into events
        self.keep = True
        self.last_ns = 0
        self.timer = None

    # -- asyncio callbacks
    def connection_made(self, tr):
        self.tr = tr
        sock = tr.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.gen.quickack:
                self.sock = sock
        if not self.connected.done():
            self.connected.set_result(True)

    def connection_lost(self, exc):
        self.closed = True
        if not self.connected.done():
            self.connected.set_exception(exc or ConnectionError("closed"))
        rec = self.rec
        if rec is not None:
            if self.state == _H_BODY_EOF and rec.status:
                self._finish(rec)  # body delimited by connection close
            else:
                rec.error = rec.error or f"connection lost: {exc!r}"
                self._finish(rec, failed=True)

    def data_received(self, data: bytes):
        t = _ns()
        if self.sock is not None:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        rec = self.rec
        if rec is None:
            return  # unsolicited bytes; ignore
        rec.nbytes += len(data)
        if self.state == _H_START:
            self.hbuf += data
            i = self.hbuf.find(b"\r\n\r\n")
            if i < 0:
                return
            head = self.hbuf[:i]
            data = self.hbuf[i + 4 :]
            self.hbuf = b""
            lines = head.split(b"\r\n")
            try:
                rec.status = int(lines[0].split(b" ", 2)[1])
            except (IndexError, ValueError):
                rec.status = 0
                rec.error = "bad status line"
                self.tr.close()
                return
            clen = -1
            chunked = False
            for ln in lines[1:]:
                k, _, v = ln.partition(b":")
                k = k.strip().lower()
                if k == b"content-length":
                    clen = int(v)
                elif k == b"transfer-encoding":
                    chunked = b"chunked" in v.lower()
                elif k == b"connection" and v.strip().lower() == b"close":
                    self.keep = False
            if lines[0].startswith(b"HTTP/1.0"):
                self.keep = False
            if chunked:
                self.state = _H_BODY_CHUNKED
            elif clen >= 0:
                self.state = _H_BODY_LEN
                self.left = clen
                if clen == 0:
                    self._finish(rec, t)
                    return
            else:
                self.state = _H_BODY_EOF
                self.keep = False
            if not data:
                return
        if self.state == _H_BODY_CHUNKED:
            if self.left == 0 and not self.cbuf:
                # fast path: exactly one complete chunk in this read (the common case)
                j = data.find(b"\r\n")
                if 0 < j < 9:
                    try:
                        size = int(data[:j], 16)
                    except ValueError:
                        size = 0
                    end = j + 2 + size
                    if size and len(data) == end + 2:
                        self._sse(data[j + 2 : end], t)
                        return
            self._chunked(data, t)
        elif self.state == _H_BODY_LEN:
            take = data[: self.left]
            self.left -= len(take)
            self._sse(take, t)
            if self.left <= 0:
                self._finish(rec, t)
        else:
            self._sse(data, t)

    # -- body decoding
    def _chunked(self, data: bytes, t: int):
        # self.left: >0 chunk-data bytes pending; 0 size line next; -2 CRLF after data; -3 trailer/end lines
        buf = self.cbuf + data if self.cbuf else data
        pos = 0
        n = len(buf)
        out = []
        end = False
        left = self.left
        while pos < n:
            if left == 0:
                j = buf.find(b"\r\n", pos)
                if j < 0:
                    break
                line = buf[pos:j]
                if b";" in line:
                    line = line.split(b";", 1)[0]
                size = int(line, 16)
                pos = j + 2
                if size == 0:
                    left = -3
                elif pos + size + 2 <= n:  # the whole chunk is here
                    out.append(buf[pos : pos + size])
                    pos += size + 2
                else:
                    left = size
            elif left > 0:
                take = min(left, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                left = left - take or -2
            elif left == -2:
                if n - pos < 2:
                    break
                pos += 2
                left = 0
            else:  # -3: trailer lines until an empty one
                j = buf.find(b"\r\n", pos)
                if j < 0:
                    break
                if j == pos:
                    end = True
                    pos += 2
                    break
                pos = j + 2
        self.left = left
        self.cbuf = b"" if end else buf[pos:]
        if out:
            self._sse(out[0] if len(out) == 1 else b"".join(out), t)
        if end:
            self._finish(self.rec, t)

    def _sse(self, data: bytes, t: int):
        if not data:
            return
        if not self.sse and data.startswith(b"data:") and data.find(b"\n\n") == len(data) - 2:
            # fast path: one whole "data:" event
            rec = self.rec
            if rec.ttft_ns >= 0:
                if data[5:].strip() == b"[DONE]":
                    rec.done = True
                else:
                    rec.gaps_ns.append(t - self.last_ns)
                    self.last_ns = t
                    rec.chunks += 1
                return
        buf = self.sse + data if self.sse else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        rec = self.rec
        start = 0
        while True:
            j = buf.find(b"\n\n", start)
            if j < 0:
                break
            ev = buf[start:j]
            start = j + 2
            # an event may have several lines; we only look at data lines
            if not ev.startswith(b"data:"):
                k = ev.find(b"\ndata:")
                if k < 0:
                    continue
                ev = ev[k + 1 :]
            payload = ev[5:].strip()
            if payload == b"[DONE]":
                rec.done = True
                continue
            if rec.ttft_ns < 0:
                if _CONTENT_RE.search(payload) is None:
                    continue  # role-only / empty first chunk
                rec.ttft_ns = t - rec.start_ns
                rec.chunks = 1
                self.last_ns = t
                continue
            rec.gaps_ns.append(t - self.last_ns)
            self.last_ns = t
            rec.chunks += 1
        self.sse = buf[start:]

    # -- request lifecycle
    def send(self, rec: Record):
        self.rec = rec
        self._reset_parser()
        g = self.gen
        if g.timeout:
            self.timer = g.loop.call_later(g.timeout, self._timeout)
        if self.sock is not None:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        rec.start_ns = _ns()
        self.tr.write(g.request_bytes)

    def _timeout(self):
        self.timer = None
        rec = self.rec
        if rec is not None:
            rec.status = -1
            rec.error = f"timeout after {self.gen.timeout}s"
            self.keep = False
            if self.closed:
                self._finish(rec, failed=True)
            else:
                self.tr.close()  # -> connection_lost -> _finish(failed)

    def _finish(self, rec: Record, t: int | None = None, failed: bool = False):
        if self.rec is not rec or rec is None:
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not failed:
            rec.e2e_ns = (t or _ns()) - rec.start_ns
        self.rec = None
        if not self.keep and not self.closed:
            self.tr.close()
            self.closed = True
        self.gen._done(self, rec)


# --------------------------------------------------------------------------- generator


class LoadGen:
    """Closed-loop generator: `concurrency` connections, each with one request in flight."""

    def __init__(self, url: str, concurrency: int, body: dict | bytes | None = None, *, client: str = "raw",
                 timeout: float = 30.0, headers: dict | None = None, quickack: bool = False):
        u = urlsplit(url)
        if u.scheme != "http":
            raise ValueError("only http:// URLs are supported")
        self.url = url
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.path = (u.path or "/") + (("?" + u.query) if u.query else "")
        self.concurrency = concurrency
        self.client = client
        self.timeout = timeout
        # Diagnostic only: ACK every read at once (TCP_QUICKACK), which hides a server's Nagle +
        # delayed-ACK stall (see bench/PEERS.md, sglang-router). Real clients do not do this.
        self.quickack = quickack
        self.body = body if isinstance(body, bytes) else _dumps(body if body is not None else chat_body())
        hdrs = {"Host": f"{self.host}:{self.port}", "Content-Type": "application/json", "Accept": "text/event-stream",
                "Content-Length": str(len(self.body))}
        hdrs.update(headers or {})
        self.headers = hdrs
        self.request_bytes = (
            f"POST {self.path} HTTP/1.1\r\n".encode()
            + b"".join(f"{k}: {v}\r\n".encode() for k, v in hdrs.items())
            + b"\r\n"
            + self.body
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self.conns: list = []
        self._session = None
        # per-run state
        self._records: list = []
        self._deadline_ns = 0
        self._left = 0
        self._active = 0
        self._finished: asyncio.Future | None = None

    # ---- connections
    async def connect(self):
        self.loop = asyncio.get_running_loop()
        if self.client == "aiohttp":
            import aiohttp

            conn = aiohttp.TCPConnector(limit=self.concurrency, force_close=False, enable_cleanup_closed=False)
            self._session = aiohttp.ClientSession(
                connector=conn, timeout=aiohttp.ClientTimeout(total=self.timeout), skip_auto_headers=("User-Agent",),
            )
            return
        # open all connections up front (in batches, to spare the listener's backlog)
        for i in range(0, self.concurrency, 64):
            batch = [self._open() for _ in range(min(64, self.concurrency - i))]
            self.conns.extend(await asyncio.gather(*batch))

    async def _open(self) -> _RawConn:
        _, proto = await self.loop.create_connection(lambda: _RawConn(self), self.host, self.port)
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
        cpu0 = _cpu_self()
        t0 = _ns()
        self._deadline_ns = t0 + int(duration * 1e9) if duration is not None else 1 << 62
        if self.client == "aiohttp":
            await asyncio.gather(*(self._aiohttp_worker() for _ in range(self.concurrency)))
        else:
            self._finished = self.loop.create_future()
            self._active = 0
            for c in list(self.conns):
                self._issue(c)
            if self._active:
                await self._finished
        wall = (_ns() - t0) / 1e9
        cpu = _cpu_self() - cpu0
        return RunResult(self._records, wall, self.concurrency, cpu)

    def _issue(self, conn: _RawConn) -> bool:
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
            self.loop.create_task(self._reconnect_and_issue())
            return True
        self._left -= 1
        conn.send(Record(0))
        return True

    def _check_finished(self):
        if self._active == 0 and self._finished is not None and not self._finished.done():
            self._finished.set_result(None)

    def _done(self, conn: _RawConn, rec: Record):
        self._records.append(rec)
        self._active -= 1
        if not self._issue(conn):
            self._check_finished()

    async def _reconnect_and_issue(self):
        # the caller counted this slot in _active already
        try:
            c = await self._open()
        except OSError as e:
            self._left -= 1  # a failed connect counts as a failed request
            self._records.append(Record(_ns(), status=0, error=f"connect: {e!r}"))
            await asyncio.sleep(0.05)
            if self._left > 0 and _ns() < self._deadline_ns:
                self.loop.create_task(self._reconnect_and_issue())
            else:
                self._active -= 1
                self._check_finished()
            return
        self.conns.append(c)
        self._active -= 1
        if not self._issue(c):
            self._check_finished()

    async def _aiohttp_worker(self):
        s = self._session
        hdrs = {k: v for k, v in self.headers.items() if k not in ("Host", "Content-Length")}
        while self._left > 0 and _ns() < self._deadline_ns:
            self._left -= 1
            rec = Record(_ns())
            try:
                async with s.post(self.url, data=self.body, headers=hdrs) as resp:
                    rec.status = resp.status
                    buf = b""
                    last = 0
                    async for data in resp.content.iter_any():
                        t = _ns()
                        rec.nbytes += len(data)
                        buf += data
                        if b"\r" in buf:
                            buf = buf.replace(b"\r\n", b"\n")
                        start = 0
                        while True:
                            j = buf.find(b"\n\n", start)
                            if j < 0:
                                break
                            ev = buf[start:j]
                            start = j + 2
                            if not ev.startswith(b"data:"):
                                k = ev.find(b"\ndata:")
                                if k < 0:
                                    continue
                                ev = ev[k + 1 :]
                            payload = ev[5:].strip()
                            if payload == b"[DONE]":
                                rec.done = True
                            elif rec.ttft_ns < 0:
                                if _CONTENT_RE.search(payload) is not None:
                                    rec.ttft_ns = t - rec.start_ns
                                    rec.chunks = 1
                                    last = t
                            else:
                                rec.gaps_ns.append(t - last)
                                last = t
                                rec.chunks += 1
                        buf = buf[start:]
                rec.e2e_ns = _ns() - rec.start_ns
            except TimeoutError:
                rec.status = -1
                rec.error = "timeout"
            except Exception as e:  # noqa: BLE001 - record and go on
                rec.error = repr(e)
            self._records.append(rec)


# --------------------------------------------------------------------------- CLI


def format_summary(s: dict) -> str:
    def d(x):
        return f"p50 {x['p50']:.3f}  p90 {x['p90']:.3f}  p99 {x['p99']:.3f} ms" if x["n"] else "n/a"

    return (
        f"requests {s['requests']} ok {s['ok']} errors {s['errors']} {s['statuses']} in {s['wall_s']:.2f}s "
        f"= {s['rps']:.0f} req/s @ c={s['concurrency']}\n"
        f"  TTFT   {d(s['ttft_ms'])}\n  ITL    {d(s['itl_ms'])}\n  E2E    {d(s['e2e_ms'])}\n"
        f"  chunks/req {s['chunks_per_req']:.1f}  bytes/req {s['bytes_per_req']:.0f}  "
        f"client CPU {s['client_cpu_s']:.2f}s ({s['client_cpu_util'] * 100:.0f}% of a core, "
        f"{s['client_cpu_us_per_req'] or 0:.0f} us/req)"
        + (f"\n  first error: {s['first_error']}" if s["first_error"] else "")
    )


async def _main_async(a) -> int:
    body = (completion_body if a.completions else chat_body)(model=a.model, max_tokens=a.max_tokens)
    clients = ["raw", "aiohttp"] if a.compare else [a.client]
    out = {}
    for client in clients:
        lg = LoadGen(a.url, a.concurrency, body, client=client, timeout=a.timeout, quickack=a.quickack)
        await lg.connect()
        if a.warmup:
            await lg.run(duration=a.warmup)
        res = await lg.run(requests=a.requests, duration=a.duration)
        await lg.close()
        s = res.summary()
        out[client] = s
        print(f"[{client}] " + format_summary(s), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="closed-loop streaming load generator")
    ap.add_argument("--url", default="http://127.0.0.1:9001/v1/chat/completions")
    ap.add_argument("-c", "--concurrency", type=int, default=1)
    ap.add_argument("-n", "--requests", type=int, default=None)
    ap.add_argument("-d", "--duration", type=float, default=None)
    ap.add_argument("--warmup", type=float, default=0.5, help="seconds of discarded load first")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--completions", action="store_true", help="send a /v1/completions-style body")
    ap.add_argument("--client", choices=["raw", "aiohttp"], default="raw")
    ap.add_argument("--compare", action="store_true", help="run raw then aiohttp with the same settings")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--quickack", action="store_true", help="diagnostic: TCP_QUICKACK after every read (raw client)")
    ap.add_argument("--cpu", type=int, default=None, help="pin this process to this CPU")
    ap.add_argument("--json", default=None, help="write summaries here")
    a = ap.parse_args(argv)
    if a.requests is None and a.duration is None:
        a.duration = 5.0
    if a.cpu is not None:
        import os

        os.sched_setaffinity(0, {a.cpu})
    try:
        import uvloop

        out = uvloop.run(_main_async(a))
    except ImportError:
        out = asyncio.run(_main_async(a))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
