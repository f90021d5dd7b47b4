#!/usr/bin/env python3
"""Closed-loop streaming load generator for OpenAI-compatible servers.

Keeps C streaming requests in flight (one keep-alive connection per stream)
against one URL, for a number of requests or a duration, and records per
request: TTFT (request written -> first SSE ``data:`` event that carries
content), every inter-chunk gap after that, end-to-end time, HTTP status and
bytes received. ``RunResult.summary()`` gives p50/p90/p99 of each.

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

Code layout: this file is the public entry point (API + CLI); the parts live in
``bench/lg/`` (``bodies``, ``records``, ``raw``, ``aiohttp_client``, ``generator``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # imported as bench.loadgen, or from elsewhere: make `lg` importable
    sys.path.insert(0, _HERE)

from lg.bodies import CONTENT_RE, chat_body, completion_body, dumps  # noqa: E402
from lg.generator import LoadGen  # noqa: E402
from lg.raw import RawConn  # noqa: E402
from lg.records import Record, RunResult, dist_ms, format_summary, percentile  # noqa: E402

__all__ = [
    "LoadGen", "Record", "RunResult", "chat_body", "completion_body", "dist_ms", "format_summary", "main",
    "percentile",
]

# names the single-file version had
_CONTENT_RE = CONTENT_RE
_RawConn = RawConn
_dumps = dumps


# --------------------------------------------------------------------------- CLI


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
