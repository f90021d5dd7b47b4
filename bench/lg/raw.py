"""The raw client: one asyncio ``Protocol`` per keep-alive connection, one streaming request at a time.

A minimal HTTP/1.1 response parser (chunked, Content-Length or close-delimited
body) and an SSE scanner, driven by callbacks (no task or future per request).
Timestamps are taken at the top of ``data_received``; TCP_NODELAY is set.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING

from lg.bodies import CONTENT_RE
from lg.records import Record

if TYPE_CHECKING:
    from lg.generator import LoadGen

_ns = time.perf_counter_ns

_H_START, _H_BODY_CHUNKED, _H_BODY_LEN, _H_BODY_EOF = 0, 1, 2, 3


class RawConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection issuing one streaming request at a time."""

    def __init__(self, gen: LoadGen, target: int = 0, request_bytes: bytes | None = None):
        self.gen = gen
        self.target = target  # which of the generator's URLs this connection talks to
        self.request_bytes = gen.request_bytes if request_bytes is None else request_bytes
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
                if CONTENT_RE.search(payload) is None:
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
        self.tr.write(self.request_bytes)

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

