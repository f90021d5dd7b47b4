#!/usr/bin/env python3
"""Minimal, low-overhead OpenAI-compatible streaming stub engine.

It is the lowest-noise "engine" for gateway-overhead measurements: it answers
``POST /v1/chat/completions`` and ``POST /v1/completions`` by streaming N SSE
chunks ``--interval-ms`` apart (first chunk after ``--ttft-ms``), where N is the
request's ``max_tokens`` / ``max_completion_tokens`` (sglang-router renames the
former to the latter) or ``--chunks``. It also serves ``/health``,
``/v1/models`` and a small ``/metrics`` with vLLM metric names.

It is a raw asyncio protocol (no web framework) with pre-encoded chunks and
TCP_NODELAY, so the engine itself costs as little CPU as possible.

    python bench/stub_engine.py --port 9001 --chunks 16 --interval-ms 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import time

try:
    import orjson

    _loads = orjson.loads
    _dumps = orjson.dumps
except ImportError:  # pragma: no cover - stdlib fallback
    import json

    _loads = json.loads

    def _dumps(o):  # type: ignore[misc]
        return json.dumps(o, separators=(",", ":")).encode()


MAX_HEADER = 64 * 1024
MAX_BODY = 16 * 1024 * 1024


def _chunk(payload: bytes) -> bytes:
    """Wrap one payload in HTTP/1.1 chunked framing."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class Engine:
    """Shared state and pre-encoded responses for all connections."""

    def __init__(self, model: str, chunks: int, interval_ms: float, ttft_ms: float, max_chunks: int):
        self.model = model
        self.default_chunks = chunks
        self.interval = interval_ms / 1000.0
        self.ttft = ttft_ms / 1000.0
        self.max_chunks = max_chunks
        self.running = 0
        self.total = 0
        self.started = time.time()
        m = _dumps(model)
        # ~vLLM-shaped chunks (similar sizes: 150-200 bytes), pre-encoded.
        self.chat_first = _chunk(
            b'data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1700000000,"model":'
            + m
            + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        )
        self.chat_tok = _chunk(
            b'data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1700000000,"model":'
            + m
            + b',"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}\n\n'
        )
        self.chat_last = _chunk(
            b'data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1700000000,"model":'
            + m
            + b',"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":"length"}]}\n\n'
            + b"data: [DONE]\n\n"
        ) + b"0\r\n\r\n"
        self.cmpl_tok = _chunk(
            b'data: {"id":"cmpl-stub","object":"text_completion","created":1700000000,"model":'
            + m
            + b',"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}\n\n'
        )
        self.cmpl_last = _chunk(
            b'data: {"id":"cmpl-stub","object":"text_completion","created":1700000000,"model":'
            + m
            + b',"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":"length"}]}\n\n'
            + b"data: [DONE]\n\n"
        ) + b"0\r\n\r\n"
        self.sse_head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n"
        )
        self.models_body = _dumps(
            {
                "object": "list",
                "data": [{"id": model, "object": "model", "created": 1700000000, "owned_by": "stub", "root": model, "max_model_len": 131072}],
            }
        )

    def metrics_body(self) -> bytes:
        return (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{self.model}"}} {self.running}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="{self.model}"}} 0\n'
            "# TYPE vllm:gpu_cache_usage_perc gauge\n"
            f'vllm:gpu_cache_usage_perc{{model_name="{self.model}"}} 0.0\n'
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{model_name="{self.model}",finished_reason="length"}} {self.total}\n'
        ).encode()


def _response(status: bytes, body: bytes, ctype: bytes, keep_alive: bool) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: " + str(len(body)).encode()
        + (b"\r\n\r\n" if keep_alive else b"\r\nConnection: close\r\n\r\n") + body
    )


class HttpConn(asyncio.Protocol):
    """One client connection: HTTP/1.1 keep-alive, Content-Length request bodies, no pipelining overlap."""

    __slots__ = ("buf", "busy", "chat", "closed", "eng", "head", "keep", "left", "loop", "need", "streaming", "timer", "tr")

    def __init__(self, eng: Engine):
        self.eng = eng
        self.loop = asyncio.get_running_loop()
        self.tr = None
        self.buf = b""
        self.need = -1  # body bytes still expected for the current request
        self.head = None
        self.busy = False  # a streamed response is in progress
        self.closed = False
        self.timer = None
        self.left = 0
        self.chat = True
        self.keep = True
        self.streaming = False

    def connection_made(self, tr):
        self.tr = tr
        sock = tr.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def connection_lost(self, exc):
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.streaming:
            self.streaming = False
            self.eng.running -= 1

    def data_received(self, data: bytes):
        self.buf += data
        while not self.busy and not self.closed:
            if self.head is None:
                i = self.buf.find(b"\r\n\r\n")
                if i < 0:
                    if len(self.buf) > MAX_HEADER:
                        self._fail(b"431 Request Header Fields Too Large")
                    return
                self.head = self.buf[:i]
                self.buf = self.buf[i + 4 :]
                self.need = 0
                lines = self.head.split(b"\r\n")
                self.keep = not lines[0].endswith(b"HTTP/1.0")
                for ln in lines[1:]:
                    k, _, v = ln.partition(b":")
                    k = k.strip().lower()
                    if k == b"content-length":
                        self.need = int(v.strip())
                    elif k == b"transfer-encoding" and b"chunked" in v.lower():
                        self._fail(b"411 Length Required")
                        return
                    elif k == b"connection":
                        lv = v.strip().lower()
                        if lv == b"close":
                            self.keep = False
                        elif lv == b"keep-alive":
                            self.keep = True
                if self.need > MAX_BODY:
                    self._fail(b"413 Payload Too Large")
                    return
            if len(self.buf) < self.need:
                return
            body = self.buf[: self.need]
            self.buf = self.buf[self.need :]
            head = self.head
            self.head = None
            self._handle(head, body)

    def _fail(self, status: bytes):
        self.tr.write(_response(status, b"", b"text/plain", False))
        self.tr.close()
        self.closed = True

    def _send(self, data: bytes):
        self.tr.write(data)
        if not self.keep:
            self.tr.close()
            self.closed = True

    def _handle(self, head: bytes, body: bytes):
        eng = self.eng
        line = head.split(b"\r\n", 1)[0]
        parts = line.split(b" ")
        if len(parts) < 2:
            self._fail(b"400 Bad Request")
            return
        method, target = parts[0], parts[1]
        path = target.split(b"?", 1)[0]
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            try:
                req = _loads(body) if body else {}
            except ValueError:
                self._send(_response(b"400 Bad Request", b'{"error":"invalid json"}', b"application/json", self.keep))
                return
            n = req.get("max_completion_tokens") or req.get("max_tokens") or eng.default_chunks
            n = max(1, min(int(n), eng.max_chunks))
            chat = path == b"/v1/chat/completions"
            eng.total += 1
            if not req.get("stream"):
                self._unary(chat, n)
                return
            self.busy = True
            self.chat = chat
            self.left = n
            self.streaming = True
            eng.running += 1
            self.tr.write(eng.sse_head + (b"\r\n" if self.keep else b"Connection: close\r\n\r\n"))
            if eng.ttft > 0:
                self.timer = self.loop.call_later(eng.ttft, self._tick_first)
            else:
                self._tick_first()
            return
        if path == b"/health" or path == b"/ping":
            self._send(_response(b"200 OK", b"", b"text/plain", self.keep))
        elif path == b"/v1/models":
            self._send(_response(b"200 OK", eng.models_body, b"application/json", self.keep))
        elif path == b"/metrics":
            self._send(_response(b"200 OK", eng.metrics_body(), b"text/plain; version=0.0.4", self.keep))
        else:
            self._send(_response(b"404 Not Found", b'{"error":"not found"}', b"application/json", self.keep))

    def _unary(self, chat: bool, n: int):
        text = " tok" * n
        if chat:
            obj = {"id": "chatcmpl-stub", "object": "chat.completion", "created": 1700000000, "model": self.eng.model,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}
        else:
            obj = {"id": "cmpl-stub", "object": "text_completion", "created": 1700000000, "model": self.eng.model,
                   "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}
        delay = self.eng.ttft + self.eng.interval * (n - 1)
        data = _response(b"200 OK", _dumps(obj), b"application/json", self.keep)
        if delay > 0:
            self.busy = True

            def done():
                self.busy = False
                if not self.closed:
                    self._send(data)
                    if self.buf and not self.closed:
                        self.data_received(b"")

            self.loop.call_later(delay, done)
        else:
            self._send(data)

    def _tick_first(self):
        if self.closed:
            return
        eng = self.eng
        if self.chat:
            # Like vLLM: a role-only first chunk, then content; both at "first token" time.
            self.tr.write(eng.chat_first)
        self._tick()

    def _tick(self):
        if self.closed:
            return
        eng = self.eng
        self.left -= 1
        if self.left <= 0:
            self.timer = None
            self.streaming = False
            eng.running -= 1
            self.busy = False
            self._send(eng.chat_last if self.chat else eng.cmpl_last)
            if self.buf and not self.closed:  # a pipelined next request
                self.data_received(b"")
            return
        self.tr.write(eng.chat_tok if self.chat else eng.cmpl_tok)
        self.timer = self.loop.call_later(eng.interval, self._tick)


async def serve(args) -> None:
    eng = Engine(args.model, args.chunks, args.interval_ms, args.ttft_ms, args.max_chunks)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: HttpConn(eng), args.host, args.port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"stub engine ready on http://{args.host}:{args.port} model={args.model} chunks={args.chunks} "
          f"interval_ms={args.interval_ms} ttft_ms={args.ttft_ms} pid={os.getpid()}", flush=True)
    await stop.wait()
    server.close()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9001)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--chunks", type=int, default=16, help="content chunks when the request sets no max_tokens")
    ap.add_argument("--max-chunks", type=int, default=4096)
    ap.add_argument("--interval-ms", type=float, default=2.0, help="gap between content chunks")
    ap.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first chunk")
    ap.add_argument("--no-uvloop", action="store_true")
    args = ap.parse_args(argv)
    runner = asyncio.run
    if not args.no_uvloop:
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            pass
    try:
        runner(serve(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
