"""bench/relay: CPU the gateway's stream relay spends per request, before and after SSE parsing.

Side by side in one run, in one process, on the same bytes: engine-sim's SSE
stream of a chat request (role chunk + N token chunks + [DONE]: one read per
token like a paced engine, four token events a read like an engine ahead of a
busy gateway, or all in one read), relayed by

* ``raw``: the previous relay (bytes to the client as-is, events counted with
  ``bytes.count``), copied here verbatim as the baseline;
* ``parsed``: today's relay (:class:`steersman.pipeline.forward._Relay`: SSE
  parser, every event validated and recorded for continuation).

Prints µs per request for each and the ratio.  The whole gateway spends
~350-400 µs of CPU per 16-token stream at 64 concurrent streams
(``make bench-overhead``), so the added µs here divided by that is the share.

    .venv/bin/python bench/relay/run.py [--tokens 16] [--requests 20000]
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

from steersman.clock import WallClock
from steersman.enginesim.chunks import ChunkWriter
from steersman.obs.metrics import GatewayMetrics
from steersman.pipeline.continuation import Continuation
from steersman.pipeline.forward import _Relay
from steersman.api.schema import decode_chat

BODY = b'{"model":"llama-3.1-8b","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hi"}]}'


class _Http:
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def send(self, data: bytes, end: bool = False) -> None:
        self.n += len(data)


class _RawRelay:
    """The relay before SSE parsing (forward.py at 327f3b4), for the side-by-side baseline."""

    __slots__ = ("ctx", "fleet", "ticket", "now", "ttft", "itl", "last", "prev", "chunk", "events")

    def __init__(self, ctx, fleet, clock, metrics) -> None:
        self.ctx = ctx
        self.fleet = fleet
        self.ticket = ctx.ticket
        self.events = 0
        self.now = clock.now
        pm = metrics.model(ctx.model)
        self.ttft = pm.ttft
        self.itl = pm.itl
        self.last = None
        self.prev = self.chunk = b""

    def __call__(self, data: bytes) -> None:
        t = self.now()
        if self.last is None:
            self.ttft.observe(t - self.ctx.started)
            self.ctx.bytes_sent = True
        elif b"\n\n" in data:
            self.itl.observe(t - self.last)
        self.events += data.count(b"data: ")
        self.last = t
        self.prev, self.chunk = self.chunk, data
        self.ctx.http.send(data)

    @property
    def saw_done(self) -> bool:
        return (self.prev[-16:] + self.chunk).rstrip().endswith(b"[DONE]")


def reads(tokens: int, per_read: int | None) -> list[bytes]:
    """The stream as the relay receives it: ``per_read`` token events a read (the role event and the first token
    together, the last token and ``[DONE]`` together when grouped), or the whole stream in one read (None)."""
    w = ChunkWriter(True, "chatcmpl-bench0001", 1700000000, "llama-3.1-8b")
    words = [" model", " token", " cache", " batch", ",", " prefix", " stream", " replica"]
    out = [w.role() + w.token(words[0])]
    out += [w.token(words[i % len(words)], "length" if i == tokens - 1 else None) for i in range(1, tokens)]
    out.append(w.done())
    if per_read is None:
        return [b"".join(out)]
    if per_read == 1:
        return out
    middle = out[1:-2]
    return ([out[0]] + [b"".join(middle[i : i + per_read]) for i in range(0, len(middle), per_read)]
            + [out[-2] + out[-1]])


def run(kind: str, chunks: list[bytes], requests: int, metrics: GatewayMetrics) -> float:
    clock = WallClock()
    req = decode_chat(BODY, 131072)
    t0 = time.process_time()
    for _ in range(requests):
        ctx = SimpleNamespace(model="llama-3.1-8b", started=0.0, ticket=None, bytes_sent=False, http=_Http())
        if kind == "raw":
            r = _RawRelay(ctx, None, clock, metrics)
            for c in chunks:
                r(c)
            assert r.saw_done
        else:
            cont = Continuation(req, BODY, None)
            cont.begin_leg()
            ex = SimpleNamespace(last=False)  # the upstream exchange: ``last`` marks the response's last bytes
            r = _Relay(ctx, None, clock, metrics, cont, False, 1 << 20, ex)
            for i, c in enumerate(chunks):
                ex.last = i == len(chunks) - 1
                r(c)
            assert cont.done and r.error is None
    return (time.process_time() - t0) / requests * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--requests", type=int, default=20000)
    a = ap.parse_args()
    metrics = GatewayMetrics()
    print(f"relay CPU per request, {a.tokens} tokens, {a.requests} requests each (process time)")
    print(f"{'reads':<26}{'raw us/req':>12}{'parsed us/req':>15}{'added us':>10}{'ratio':>8}")
    for label, per_read in (("one read per token", 1), ("4 tokens a read", 4), ("whole stream in one read", None)):
        chunks = reads(a.tokens, per_read)
        run("raw", chunks, a.requests // 10, metrics)  # warm-up
        run("parsed", chunks, a.requests // 10, metrics)
        raw = min(run("raw", chunks, a.requests, metrics) for _ in range(3))
        parsed = min(run("parsed", chunks, a.requests, metrics) for _ in range(3))
        print(f"{label:<26}{raw:>12.1f}{parsed:>15.1f}{parsed - raw:>10.1f}{parsed / raw:>7.2f}x")


if __name__ == "__main__":
    main()
