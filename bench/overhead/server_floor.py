#!/usr/bin/env python
"""The gateway's HTTP server against a bare asyncio protocol, one request at a time: what the server itself costs
on a cold core, on a kept-alive connection and on a new one.

    .venv/bin/python bench/overhead/server_floor.py [--requests 60] [--gap 0.02]

Both servers run on uvloop in this process and answer ``{}`` to a small POST; a client thread sends the requests
``--gap`` apart (so each finds the caches cold, as bench/peers' added-latency probe does) and times each from its
first byte sent (or its connect, for new connections) to the answer.  Prints the medians side by side: the
difference is httptools' parsing, the request object, the handler's task and the answer's framing, on the path
every request of the gateway takes.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import uvloop

from steersman.api.errors import error_body
from steersman.http.server import HttpServer

REQUEST = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"


class _Bare(asyncio.Protocol):
    """Answers any read that ends a request head: the floor of an asyncio server on this loop."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" in data:
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _client(port: int, fresh: bool, n: int, gap: float) -> float:
    times = []
    s = _connect(port)
    for _ in range(n):
        time.sleep(gap)
        if fresh:
            s.close()
            t0 = time.perf_counter_ns()
            s = _connect(port)
        else:
            t0 = time.perf_counter_ns()
        s.sendall(REQUEST)
        s.recv(4096)
        times.append((time.perf_counter_ns() - t0) / 1e3)
    s.close()
    return statistics.median(times)


async def _main(a) -> None:
    loop = asyncio.get_running_loop()
    srv = HttpServer(error_body, 10_000)

    async def answer(req) -> None:
        req.respond(200, b"{}")

    srv.route("POST", "/x", answer)
    ours = await srv.start("127.0.0.1", 0)
    bare_srv = await loop.create_server(_Bare, "127.0.0.1", 0)
    bare = bare_srv.sockets[0].getsockname()[1]
    pool = ThreadPoolExecutor(1)
    print(f"one request every {a.gap * 1e3:g} ms, medians of {a.requests} (us, first byte or connect -> answer)")
    for r in range(a.rounds):
        row = []
        for port in (ours, bare):
            for fresh in (False, True):
                row.append(await loop.run_in_executor(pool, _client, port, fresh, a.requests, a.gap))
        print(f"  round {r + 1}: steersman server kept-alive {row[0]:6.1f}, new connection {row[1]:6.1f}   "
              f"bare protocol {row[2]:6.1f}, {row[3]:6.1f}   difference {row[0] - row[2]:+6.1f}, {row[1] - row[3]:+6.1f}")
    bare_srv.close()
    await srv.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--gap", type=float, default=0.02, help="seconds between requests")
    ap.add_argument("--rounds", type=int, default=3)
    uvloop.run(_main(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
