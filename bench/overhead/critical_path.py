#!/usr/bin/env python
"""Where one request's time goes inside the gateway before it reaches the engine, and on the way back of its
first event (one request at a time).

The gateway runs in this process (uvloop, as ``steersman serve``) in front of one engine-sim; a raw
client sends short streamed requests one after another, ``--gap`` apart.  Timestamps are taken at
the request's bytes arriving, each stage of the request path starting, the upstream request, the
engine's first streamed bytes reaching the relay and their write to the client (``upstream -> relay
in`` is the engine's own time); the call times of the schedule stage's parts are recorded too.
Prints the p50/p90 of each step.

    .venv/bin/python bench/overhead/critical_path.py [--policy steersman] [--requests 600] [--gap 0.005]
    .venv/bin/python bench/overhead/critical_path.py --prompt-words 1500 --requests 300   # long unique prompts
    .venv/bin/python bench/overhead/critical_path.py --llama --requests 300 --gap 0.05    # one llama-server

This is a diagnostic (it wraps internals to time them, which adds ~0.3 µs a call), not a benchmark:
bench/overhead measures added latency and CPU side by side with the Rust routers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

import numpy as np
import uvloop

from steersman.api import gateway as gateway_module
from steersman.api.gateway import Gateway
from steersman.control import accounting, plane
from steersman.fleet import prefix_index, state
from steersman.fleet.config import parse_fleet
from steersman.fleet.processes import LlamaServerFleet
from steersman.http import client as http_client
from steersman.http import server as http_server
from steersman.pipeline import admit, brownout, forward, stages
from steersman.policy import fastpath

MARKS: list[tuple[str, int]] = []
CALLS: dict[str, list[int]] = {}
ORDER = ["bytes in", "handler", "parse", "auth", "resolve", "describe", "brownout", "schedule", "forward", "upstream",
         "relay in", "client send"]


def _mark(cls, name: str, tag: str, is_async: bool = False) -> None:
    f = getattr(cls, name)
    if is_async:
        async def g(self, *a, **k):
            MARKS.append((tag, time.perf_counter_ns()))
            return await f(self, *a, **k)
    else:
        def g(self, *a, **k):
            MARKS.append((tag, time.perf_counter_ns()))
            return f(self, *a, **k)
    setattr(cls, name, g)


def _timed(cls, name: str, tag: str) -> None:
    f = getattr(cls, name)

    def g(self, *a, **k):
        t0 = time.perf_counter_ns()
        try:
            return f(self, *a, **k)
        finally:
            CALLS.setdefault(tag, []).append(time.perf_counter_ns() - t0)
    setattr(cls, name, g)


def instrument() -> None:
    _mark(http_server._Connection, "data_received", "bytes in")
    _mark(gateway_module.Gateway, "_handle", "handler", True)
    for cls, tag in [(stages.ParseRequest, "parse"), (admit.Authenticate, "auth"), (stages.ResolveModel, "resolve"),
                     (admit.Describe, "describe"), (brownout.Brownout, "brownout"), (admit.Schedule, "schedule"),
                     (forward.Forward, "forward")]:
        _mark(cls, "run", tag, True)
    _mark(http_client.UpstreamPool, "request", "upstream", True)
    _mark(http_client._UpConn, "_flush", "relay in")  # the engine's first streamed bytes reach the relay
    _mark(http_server.HttpRequest, "send", "client send")  # ... and are written to the client
    for cls, name, tag in [(state.Fleet, "snapshot", "fleet snapshot"), (plane.ControlPlane, "arrive", "admit + decide"),
                           (fastpath._Fused, "__call__", "decision (fused path)"),
                           (accounting.Accounting, "dispatched", "accounting"), (state.Fleet, "begin", "fleet begin"),
                           (prefix_index.PrefixIndex, "record", "prefix record")]:
        _timed(cls, name, tag)


MODEL = "llama-3.1-8b"


def _request(i: int, words: int) -> bytes:
    """A short question, or (``words`` > 0) a prompt of that many words unique to request ``i``, or (``words``
    < 0: ``--llama``) bench/peers' probe, a short question unique to request ``i`` asking for one token."""
    if words < 0:
        text, tokens = f"Probe {i}: say ok.", 1
    else:
        text, tokens = " ".join(f"doc{i}-w{j}" for j in range(words)) if words else "hello there, how are you?", 4
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": text}]}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


async def drive(port: int, n: int, gap: float, words: int = 0) -> np.ndarray:
    short = _request(0, 0)
    r, w = await asyncio.open_connection("127.0.0.1", port)
    rows = []
    for i in range(n):
        req = _request(i, words) if words else short
        MARKS.clear()
        w.write(req)
        buf = b""
        while not buf.endswith(b"\r\n0\r\n\r\n"):  # the last chunk (a header ending in 0 is not it: X-Request-Id)
            buf += await r.read(65536)
        first = {}
        for tag, t in MARKS:
            first.setdefault(tag, t)
        if i >= n // 10:  # warm-up excluded
            rows.append([first[b] - first[a] for a, b in zip(ORDER, ORDER[1:])])
        await asyncio.sleep(gap)
    w.close()
    return np.asarray(rows) / 1e3


async def main(a) -> None:
    global MODEL
    if a.llama:
        lf = LlamaServerFleet(1)
        if lf.binary is None or lf.model is None:
            raise SystemExit("llama-server / GGUF missing: run `make llama` first")
        MODEL, argv, endpoint = lf.settings.model_name, lf.command(a.engine_port), {"engine": "llamacpp"}
        a.prompt_words = -1
    else:
        argv = [sys.executable, "-m", "steersman", "engine-sim", "--gpu", "H100", "--model", MODEL, "--port",
                str(a.engine_port), "--speedup", "4"]
        endpoint = {"engine": "vllm", "gpu": "H100"}
    engine = subprocess.Popen([str(x) for x in argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await asyncio.sleep(10.0 if a.llama else 3.0)
        cfg = parse_fleet({"gateway": {"host": "127.0.0.1", "port": a.port}, "policy": a.policy,
                           "endpoints": [{"name": "e0", "url": f"http://127.0.0.1:{a.engine_port}",
                                          "models": [MODEL], **endpoint}]})
        gw = Gateway(cfg)
        await gw.start()
        try:
            steps = await drive(a.port, a.requests, a.gap, a.prompt_words)
        finally:
            await gw.stop()
    finally:
        engine.kill()
    what = ("llama-server, unique short questions" if a.llama else
            f"unique {a.prompt_words}-word prompts" if a.prompt_words else "short questions")
    print(f"{a.requests} requests one at a time ({what}), {a.gap * 1e3:.1f} ms apart, policy {a.policy} (µs)")
    for (x, y), col in zip(zip(ORDER, ORDER[1:]), steps.T):
        print(f"  {x + ' -> ' + y:24} p50 {np.median(col):8.1f}   p90 {np.percentile(col, 90):8.1f}")
    print("  calls:")
    for tag, v in CALLS.items():
        v = np.asarray(v[len(v) // 10:]) / 1e3
        print(f"  {tag:24} p50 {np.median(v):8.1f}   p90 {np.percentile(v, 90):8.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default="steersman")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--gap", type=float, default=0.005, help="seconds between requests")
    ap.add_argument("--prompt-words", type=int, default=0,
                    help="0: a short question; N: a prompt of N words unique to each request (1500: ~8,000 tokens)")
    ap.add_argument("--llama", action="store_true",
                    help="one llama-server (make llama) instead of engine-sim, bench/peers' probe as the request")
    ap.add_argument("--port", type=int, default=9300)
    ap.add_argument("--engine-port", type=int, default=9301)
    args = ap.parse_args()
    instrument()
    uvloop.run(main(args))
