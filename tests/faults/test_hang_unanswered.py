"""Requests a hung replica never answered (no response headers, or a whole body awaited) move when it is ejected.

A streamed attempt is evicted by dropping its engine connection once the response
has started; an attempt with no response yet has no such connection to drop, so
eviction cancels the attempt itself (its upstream request is aborted) and it is
retried elsewhere.  Non-streamed requests are the everyday case: an engine sends
their response head only with the whole body.

Routing is round-robin so that replica 1 surely holds non-streamed requests and streams when it hangs
(under the default profile, where they land follows the load: in one full-suite run of six none of the
24 reached replica 1 within 5 s).  Eviction and ejection belong to the request runner and the reliability
filter, which every profile shares.
"""

import asyncio
import gc
import time

import httpx

from conftest import SPEEDUP, background, body, fault, result, scaled, until
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet
from steersman.testing.faultload import Client, Load, open_loop

RATE = 40.0
RUN_S = 4.0
WHOLE = 24  # non-streamed requests in flight when the replica hangs


def test_non_streamed_requests_on_a_hung_replica_are_retried_elsewhere():
    gc.collect()
    sims = [SimServerConfig(speedup=SPEEDUP, port=0) for _ in range(3)]
    rel = scaled(latency_floor_ttft_s=2.0 / SPEEDUP)
    with LiveFleet(sims=sims, policy="round-robin", extra={"reliability": rel}) as lf:
        gw = lf.gateway

        async def load():  # streams keep the peers' latency samples coming
            c = Client(lf.url, retries=0, patience_s=20.0)
            try:
                return await open_loop(c, [Load("std", body=body("steady questions", 24))], RATE, RUN_S)
            finally:
                await c.close()

        async def whole():
            async with httpx.AsyncClient(timeout=30.0) as http:
                async def one(k: int):
                    t0 = time.monotonic()
                    r = await http.post(lf.url + "/v1/chat/completions", json=body(f"{k} whole answer", 400))
                    return r.status_code, time.monotonic() - t0, r.json()
                return await asyncio.gather(*(one(k) for k in range(WHOLE)))

        th, box = background(load)
        time.sleep(1.0)
        wt, wbox = background(whole)
        until(lambda: lf.call(_whole_on, gw, 1) > 0, "a non-streamed request in flight on replica 1", timeout=5.0)
        fault(lf.sims[1].url, hang=True)
        until(lambda: lf.call(_blocked, gw, 1), "the hung replica is ejected", timeout=RUN_S)
        answers = result(wt, wbox, timeout=30.0)
        streams = result(th, box)
        fault(lf.sims[1].url)
        counts = lf.call(_counts, gw)
    assert [s for s, _, _ in answers] == [200] * WHOLE, [a[2] for a in answers if a[0] != 200][:3]
    assert all(a[2]["choices"][0]["message"]["content"] for a in answers)
    # 400 tokens take ~0.5 s at this speed: none waited for the client's 30 s timeout
    assert max(t for _, t, _ in answers) < 10.0, sorted(t for _, t, _ in answers)[-3:]
    assert counts.get(("evicted",), 0) >= 1, counts
    assert not [d for d in streams if not d.ok]


async def _blocked(gw, replica: int) -> bool:
    """On the gateway's loop: judging ejection runs the sweep, whose evictions belong to that loop."""
    return gw.fleet.blocked(replica)


async def _whole_on(gw, replica: int) -> int:
    return sum(1 for ctx in gw.pipeline._active.get(replica, ()) if not ctx.stream)  # noqa: SLF001


async def _counts(gw):
    return dict(gw.pipeline.retrier.counts.values)


def test_a_replica_hung_under_whole_responses_alone_is_ejected():
    """Reliability audit: with no stream in flight anywhere, a hung replica's non-streamed requests waited for the
    client's timeout (90 s there) and it was never ejected: only requests awaiting a first token counted as a
    stall, and a whole response shows none."""
    gc.collect()
    sims = [SimServerConfig(speedup=SPEEDUP, port=0) for _ in range(3)]
    rel = scaled(latency_floor_ttft_s=2.0 / SPEEDUP)
    with LiveFleet(sims=sims, policy="round-robin", extra={"reliability": rel}) as lf:
        gw = lf.gateway

        async def whole():
            async with httpx.AsyncClient(timeout=30.0) as http:
                async def one(k: int):
                    await asyncio.sleep(0.05 * k)  # one every 50 ms, over 1.2 s
                    t0 = time.monotonic()
                    r = await http.post(lf.url + "/v1/chat/completions", json=body(f"{k} whole answer", 40))
                    return r.status_code, time.monotonic() - t0
                return await asyncio.gather(*(one(k) for k in range(WHOLE)))

        fault(lf.sims[1].url, hang=True)
        wt, wbox = background(whole)
        until(lambda: lf.call(_blocked, gw, 1), "the hung replica is ejected", timeout=10.0)
        answers = result(wt, wbox, timeout=30.0)
        fault(lf.sims[1].url)
        counts = lf.call(_counts, gw)
    assert [s for s, _ in answers] == [200] * WHOLE
    assert max(t for _, t in answers) < 10.0, sorted(t for _, t in answers)[-3:]
    assert counts.get(("evicted",), 0) >= 1, counts


def test_a_fleet_frozen_all_at_once_answers_504_not_never():
    """Reliability audit: every replica hung, no deadline asked: a streamed and a whole request got no byte for
    150 s (the stall rule never ejects the whole fleet).  An attempt whose replica shows no progress for
    stream_idle_timeout_s (and 3x its prediction) is a failure of that replica: retried elsewhere, then 504."""
    gc.collect()
    sims = [SimServerConfig(speedup=SPEEDUP, port=0) for _ in range(2)]
    rel = scaled(latency_floor_ttft_s=2.0 / SPEEDUP, stream_idle_timeout_s=1.0)
    with LiveFleet(sims=sims, policy="round-robin", extra={"reliability": rel}) as lf:
        for s in lf.sims:
            fault(s.url, hang=True)

        async def both():
            async with httpx.AsyncClient(timeout=30.0) as http:
                async def one(stream: bool):
                    t0 = time.monotonic()
                    r = await http.post(lf.url + "/v1/chat/completions", json={**body("frozen", 8), "stream": stream})
                    return r.status_code, r.text, time.monotonic() - t0
                return await asyncio.gather(one(False), one(True))

        th, box = background(both)
        (whole, whole_text, whole_s), (stream, stream_text, stream_s) = result(th, box, timeout=30.0)
        for s in lf.sims:
            fault(s.url)
        counts = lf.call(_counts, lf.gateway)
    assert whole == 504 and "no progress" in whole_text and "upstream_timeout" in whole_text, whole_text
    assert "no progress" in stream_text and (stream == 504 or "upstream_timeout" in stream_text), stream_text
    assert max(whole_s, stream_s) < 15.0, (whole_s, stream_s)
    assert counts.get(("attempt_idle",), 0) >= 2, counts
