#!/usr/bin/env python
"""Every routing decision of one bench/peers run, joined with what the engine and the client saw.

The gateway runs with its dispatch wrapped: each request's chosen replica, reason, predicted TTFT, time
waited in the gateway, every replica's in-flight count, pending prefill and learnt TPOT, and the prefix
index's (slot mirror's) match on each replica go to a JSON-lines log.  The client sends the same seeded
workload as ``run.py`` with an ``x-trace-i`` header and records its TTFT and llama-server's own ``timings``
(``cache_n`` reused, ``prompt_n`` computed, ``prompt_ms``).  Prints one line per request and two checks:
whether the index's match agreed with what the engine reused, and how many requests equally cached on every
replica went to a busier one.

    .venv/bin/python bench/peers/trace.py                 # the llama.cpp fleet (make llama first)
    .venv/bin/python bench/peers/trace.py --fleet sim
    .venv/bin/python bench/peers/trace.py --out /tmp/t    # keep the logs (t.dec.jsonl, t.cli.json)

A diagnostic: it found the slot mirror missing llama-server's idle-slot saving and the learnt TPOT of
identical replicas drifting apart (bench/README.md, seventh session).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]


def serve(log: str, argv: list[str]) -> None:
    """``steersman <argv>`` with every dispatch logged to ``log``."""
    from steersman.api import lifecycle
    from steersman.cli import app
    from steersman.fleet import snapshot as S
    from steersman.policy.framework import DecisionContext

    out = open(log, "a", buffering=1)
    dispatch = lifecycle.RequestLifecycle.start_dispatch

    def logged(self, ctx, d, *earlier):
        snap, now = self.fleet.snapshot(), self.clock.now()
        live = snap.live
        req = ctx.sched
        p = DecisionContext(snap, req, snap.candidates(req.model)).feature("prediction")
        pred = dict(zip(snap.candidates(req.model).tolist(), zip(p.ttft.tolist(), p.e2e.tolist())))
        out.write(json.dumps({
            "i": ctx.http.headers.get("x-trace-i"), "t": now, "waited": now - ctx.started,
            "replica": d.route.replica, "reason": d.route.reason, "expected_ttft": d.route.expected_ttft_s,
            "in_flight": live[S.IN_FLIGHT].tolist(), "pending": live[S.PENDING_PREFILL].tolist(),
            "tpot_ratio": live[S.TPOT_RATIO].tolist(), "decode_s_token": live[S.DECODE_S_TOKEN].tolist(),
            "match": [] if snap.prefix is None else [int(x) for x in snap.prefix.match(req.block_hashes)],
            "pred": {str(k): v for k, v in pred.items()},
        }) + "\n")
        return dispatch(self, ctx, d, *earlier)

    lifecycle.RequestLifecycle.start_dispatch = logged
    sys.argv = ["steersman", *argv]
    app()


async def _one(session, url: str, model: str, i: int, req, max_tokens: int) -> dict:
    import orjson

    body = {"model": model, "messages": list(req.messages), "stream": True, "max_tokens": max_tokens, "temperature": 0}
    t0, ttft, timings = time.perf_counter(), None, None
    async with session.post(url + "/v1/chat/completions", data=orjson.dumps(body),
                            headers={"Content-Type": "application/json", "x-trace-i": str(i)}) as resp:
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            ev = orjson.loads(line[6:])
            timings = ev.get("timings", timings)
            if ttft is None and any((c.get("delta") or {}).get("content") for c in ev.get("choices") or ()):
                ttft = time.perf_counter() - t0
    return {"i": i, "t0": t0, "ttft": ttft, "e2e": time.perf_counter() - t0, "timings": timings, "tenant": req.tenant}


async def _drive(url: str, model: str, reqs: list, concurrency: int, max_tokens: int) -> list[dict]:
    import aiohttp

    results: list = [None] * len(reqs)
    nxt = 0

    async def worker(session) -> None:
        nonlocal nxt
        while nxt < len(reqs):
            i = nxt
            nxt += 1
            results[i] = await _one(session, url, model, i, reqs[i], max_tokens)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))
    return results


def report(decisions: dict[int, dict], results: list[dict], block_size: int = 16) -> None:
    t0 = min(r["t0"] for r in results)
    agree = known = busier = equal = 0
    for r in sorted(results, key=lambda r: r["t0"]):
        d, tm = decisions.get(r["i"], {}), r["timings"] or {}
        rep, match = d.get("replica"), d.get("match") or []
        cached = tm.get("cache_n")
        if cached is not None and match:  # did the index say what the engine then reused (most of it or little)?
            half = 0.5 * (cached + tm.get("prompt_n", 0))
            known += 1
            agree += (match[rep] * block_size >= half) == (cached >= half)
        if match and len(set(match)) == 1:
            equal += 1
            busier += d["in_flight"][rep] > min(d["in_flight"])
        print(f"{r['i']:4d} t={r['t0'] - t0:6.2f} tenant={str(r['tenant']):4s} ttft={1e3 * (r['ttft'] or float('nan')):6.0f} ms "
              f"e2e={1e3 * r['e2e']:6.0f} -> r{rep} waited={1e3 * d.get('waited', 0):5.0f} "
              f"expected={1e3 * (d.get('expected_ttft') or 0):5.0f} match={match} in_flight={d.get('in_flight')} "
              f"cache_n={cached} prompt_n={tm.get('prompt_n')} prompt_ms={tm.get('prompt_ms', 0):.0f}")
    ttfts = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    print(f"TTFT p50 {1e3 * ttfts[len(ttfts) // 2]:.1f} ms, max {1e3 * ttfts[-1]:.1f} ms")
    if known:
        print(f"index match agreed with the engine's cache_n on {agree} of {known} requests")
    print(f"{busier} of {equal} requests equally cached on every replica went to a busier one")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        return serve(sys.argv[2], sys.argv[3:])
    import run as R
    from fleets import start_engines, start_router
    from procs import ProcessGroup

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet", choices=["llamacpp", "sim"], default="llamacpp")
    ap.add_argument("--out", default=None, help="keep the logs as OUT.dec.jsonl and OUT.cli.json")
    args = ap.parse_args()
    a = R.parse_args([])
    spec, reqs, conc, mt = R.fleet_workload(a, args.fleet)
    tmp = Path(tempfile.mkdtemp(prefix="peers-trace-"))
    out = Path(args.out) if args.out else tmp / "trace"
    log = Path(f"{out}.dec.jsonl")
    log.unlink(missing_ok=True)
    wrapper = tmp / "steersman-traced"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" --serve "{log}" "$@"\n')
    os.chmod(wrapper, 0o755)
    pg = ProcessGroup(tmp)
    try:
        urls = start_engines(spec, pg, spec.name)
        base = start_router("steersman", spec, pg, urls, Path(a.peers_venv), str(wrapper))
        results = asyncio.run(_drive(base, spec.model, reqs, conc, mt))
    finally:
        pg.stop_all()
    Path(f"{out}.cli.json").write_text(json.dumps(results))
    decisions: dict[int, dict] = {}
    for line in log.read_text().splitlines():
        d = json.loads(line)
        if d["i"] is not None:
            decisions.setdefault(int(d["i"]), d)  # the first dispatch (a continuation would add more)
    report(decisions, results)


if __name__ == "__main__":
    main()
