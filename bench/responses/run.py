#!/usr/bin/env python
"""bench/responses: what the Responses API costs the gateway over the chat completion it runs as.

One ``steersman serve`` (its own process; two engine-sim replicas as its children), one load client in this
process (aiohttp, a closed loop of ``--concurrency`` streams).  Rounds alternate the endpoints on the same gateway
and engines: ``chat`` (``/v1/chat/completions``, streamed, usage included) and ``responses`` (``/v1/responses``,
the same conversation, streamed), then each whole (non-streamed).  Per round: the gateway process's own CPU (not
its engines') per request, and the client's TTFT p50 (first content event).  Prints the medians over rounds and
the ratios responses / chat, measured side by side.

    .venv/bin/python bench/responses/run.py [--rounds 3] [--requests 1500] [--concurrency 16] [--tokens 16]

Talks to 127.0.0.1 only; stops by itself (bounded requests, a timeout per request).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp
import psutil

MODEL = "llama-3.1-8b"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Explain KV caches to me."}]


def _bodies(tokens: int) -> dict[str, tuple[str, dict]]:
    common = {"model": MODEL, "ignore_eos": True}
    return {
        "chat stream": ("/v1/chat/completions", {**common, "messages": MESSAGES, "max_tokens": tokens, "stream": True,
                                                 "stream_options": {"include_usage": True}}),
        "responses stream": ("/v1/responses", {**common, "instructions": MESSAGES[0]["content"],
                                               "input": MESSAGES[1]["content"], "max_output_tokens": tokens,
                                               "stream": True, "store": False}),
        "chat whole": ("/v1/chat/completions", {**common, "messages": MESSAGES, "max_tokens": tokens}),
        "responses whole": ("/v1/responses", {**common, "instructions": MESSAGES[0]["content"],
                                              "input": MESSAGES[1]["content"], "max_output_tokens": tokens,
                                              "store": False}),
    }


async def _load(url: str, body: dict, n: int, concurrency: int) -> list[float]:
    """``n`` requests, ``concurrency`` at a time; returns the TTFTs (s) of those that succeeded."""
    ttfts: list[float] = []
    left = [n]
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as s:
        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                t0 = time.perf_counter()
                async with s.post(url, json=body) as r:
                    first = None
                    async for chunk in r.content.iter_any():
                        if first is None and (b'"content":"' in chunk or b'output_text.delta' in chunk
                                              or b'"output"' in chunk or b'"choices"' in chunk):
                            first = time.perf_counter()
                    if r.status == 200 and first is not None:
                        ttfts.append(first - t0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ttfts


def _start(port: int, speedup: float) -> subprocess.Popen:
    cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    cfg.write(f"gateway: {{host: 127.0.0.1, port: {port}}}\npolicy: steersman\nsimulated:\n  speedup: {speedup}\n"
              f"  replicas:\n    - {{gpu: H100-SXM, model: {MODEL}, count: 2}}\n")
    cfg.close()
    exe = os.path.join(os.path.dirname(sys.executable), "steersman")
    proc = subprocess.Popen([exe, "serve", "--config", cfg.name], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    deadline = time.monotonic() + 60
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("steersman ready"):
            return proc
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit("steersman serve did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1500, help="per endpoint and round")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--speedup", type=float, default=20.0)
    ap.add_argument("--port", type=int, default=18431)
    a = ap.parse_args()
    proc = _start(a.port, a.speedup)
    gw = psutil.Process(proc.pid)
    url = f"http://127.0.0.1:{a.port}"
    cpu: dict[str, list[float]] = {}
    ttft: dict[str, list[float]] = {}
    try:
        for name, (path, body) in _bodies(a.tokens).items():  # warm-up: every path once
            asyncio.run(_load(url + path, body, 50, 4))
        for rnd in range(a.rounds):
            for name, (path, body) in _bodies(a.tokens).items():
                before = sum(gw.cpu_times()[:2])
                t = asyncio.run(_load(url + path, body, a.requests, a.concurrency))
                used = sum(gw.cpu_times()[:2]) - before
                if len(t) != a.requests:
                    raise SystemExit(f"{name}: {a.requests - len(t)} of {a.requests} requests failed")
                cpu.setdefault(name, []).append(used / a.requests * 1e6)
                ttft.setdefault(name, []).append(statistics.median(t) * 1e3)
                print(f"round {rnd + 1} {name:17s} gateway CPU {cpu[name][-1]:7.1f} us/req  TTFT p50 "
                      f"{ttft[name][-1]:6.2f} ms", flush=True)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    med = {k: (statistics.median(cpu[k]), statistics.median(ttft[k])) for k in cpu}
    print(f"\nmedians over {a.rounds} rounds, {a.requests} requests each, {a.concurrency} streams, {a.tokens} tokens:")
    print(f"{'endpoint':18s} {'gateway us/req':>15s} {'TTFT p50 ms':>12s}")
    for k, (c, t) in med.items():
        print(f"{k:18s} {c:15.1f} {t:12.2f}")
    for kind in ("stream", "whole"):
        c_r, t_r = med[f"responses {kind}"]
        c_c, t_c = med[f"chat {kind}"]
        print(f"responses / chat ({kind}): gateway CPU {c_r / c_c:.2f}x (+{c_r - c_c:.0f} us), TTFT {t_r / t_c:.2f}x")


if __name__ == "__main__":
    main()
