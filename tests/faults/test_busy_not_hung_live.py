"""A replica decoding whole (non-streamed) responses is busy, not hung, though it streams nothing to the gateway.

Three engine-sim replicas of one batch slot each behind a real gateway (round-robin, so placement is known): one
gets a long non-streamed request, then a streamed request that waits behind it in the engine.  The gateway sees no
event on any stream there for seconds while its peers answer at once: the stall rule's signal for a hung GPU.
What tells them apart is the engine's work counter on its ``/metrics`` page (``vllm:generation_tokens_total``,
read by every scrape): it advances at every step of the long decode.  Before the scrape counted it, the busy
replica was ejected within the (scaled) TTFT floor; a hung engine's counter stops and it still is
(tests/faults/test_hang.py)."""

import asyncio
import time
from dataclasses import replace

import httpx

from conftest import SPEEDUP, MODEL, background, result, scaled
from steersman.config import DEFAULTS
from steersman.enginesim.app import SimServerConfig
from steersman.fleet import snapshot as S_
from steersman.testing import LiveFleet

FLOOR_S = 0.3  # the stall floor, scaled down so the test stays short (the 2 s / SPEEDUP is 0.2)
WATCH_S = 1.5  # how long the streamed request waits behind the long decode while the test watches


def _req(max_tokens: int, stream: bool) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream,
            "messages": [{"role": "user", "content": "tell me a long story"}]}


async def _state(gw):
    live = gw.fleet.live
    return (int(gw.fleet.guard.outliers.total.sum()), list(gw.fleet.guard.outliers.reasons), gw.clock.now(),
            live[S_.IN_FLIGHT].tolist(), live[S_.STALLED_SINCE].tolist())


def test_a_replica_decoding_a_whole_response_is_not_ejected_while_a_stream_waits_behind_it():
    one_slot = replace(DEFAULTS.engine, max_num_seqs=1)
    sims = [SimServerConfig(speedup=SPEEDUP, port=0, engine=one_slot) for _ in range(3)]
    rel = scaled(latency_floor_ttft_s=FLOOR_S)
    with LiveFleet(sims=sims, policy="round-robin", extra={"reliability": rel}) as lf:
        url = lf.url + "/v1/chat/completions"
        with httpx.Client(timeout=30.0) as c:
            for _ in range(15):  # 5 first tokens per replica: every peer's TTFT is judged
                assert c.post(url, json=_req(2, True)).status_code == 200

        async def load():
            async with httpx.AsyncClient(timeout=30.0) as ac:
                # round-robin: the long request's replica gets every third request after it
                long = asyncio.ensure_future(ac.post(url, json=_req(4000, False)))  # ~30 s simulated, ~3 s here
                await asyncio.sleep(0.2)
                for _ in range(2):
                    assert (await ac.post(url, json=_req(2, True))).status_code == 200
                sent = [asyncio.ensure_future(ac.post(url, json=_req(2, True)))]  # waits behind the long decode
                t0 = time.monotonic()
                while time.monotonic() - t0 < WATCH_S:  # the peers keep answering (a third waits on replica 0)
                    sent.append(asyncio.ensure_future(ac.post(url, json=_req(2, True))))
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.2)
                done = [f.result() for f in sent if f.done()]
                for f in (long, *sent):
                    f.cancel()
                return done

        th, box = background(load)
        time.sleep(0.6 + WATCH_S / 2)
        mid = lf.call(_state, lf.gateway)
        answered = result(th, box)
        end = lf.call(_state, lf.gateway)
    assert len(answered) >= 10 and all(r.status_code == 200 for r in answered)
    # the scenario: at mid-watch replica 0 held the long decode and the stream waiting for a first token, well
    # past the floor and the peers' TTFT
    ejected, reasons, now, in_flight, since = mid
    busy = max(range(3), key=lambda i: in_flight[i])  # the long decode and the streams waiting behind it
    assert in_flight[busy] >= 2 and now - since[busy] >= FLOOR_S, mid
    assert ejected == 0 and end[0] == 0, (reasons, end[1])
