"""Deadlines reach the engine: at the deadline the upstream exchange is dropped and the client gets 504 (or, once
part of a stream went out, an error event ending it)."""

import time

import httpx

from conftest import SPEEDUP, body, fault, until
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet


def test_deadline_cancels_the_engine_work_and_answers_504_or_ends_the_stream():
    with LiveFleet(sims=[SimServerConfig(speedup=SPEEDUP, port=0)]) as lf:
        url = lf.url + "/v1/chat/completions"
        engine = lf.sims[0]
        assert httpx.post(url, json=body("warm up"), timeout=30).status_code == 200
        fault(engine.url, hang=True)  # the engine accepts work but makes no progress
        t0 = time.monotonic()
        r = httpx.post(url, json=body("never answered"), headers={"x-steersman-deadline-ms": "400"}, timeout=30)
        took = time.monotonic() - t0
        assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded", r.text
        assert 0.35 <= took < 2.0, took
        until(lambda: engine.engine.state().num_running + engine.engine.state().num_waiting == 0,
              "the engine dropped the cancelled request", timeout=5)
        # a stream whose engine sent nothing before the deadline: no byte reached the client (the stream's head is
        # held until the first event), so it gets the 504 itself, as a whole response
        t0 = time.monotonic()
        with httpx.stream("POST", url, json={**body("a stream"), "stream": True},
                          headers={"x-steersman-deadline-ms": "400"}, timeout=30) as s:
            text = s.read().decode()
        assert s.status_code == 504 and "deadline_exceeded" in text, text
        assert time.monotonic() - t0 < 2.0
        fault(engine.url)
        # a stream that was under way at its deadline (first token in ~10 ms, the whole ~1.6 s): it ends with an event
        with httpx.stream("POST", url, json={**body("a long stream", max_tokens=2000), "stream": True},
                          headers={"x-steersman-deadline-ms": "400"}, timeout=30) as s:
            text = s.read().decode()
        assert s.status_code == 200 and '"content"' in text and "deadline_exceeded" in text, text[-500:]
        gw = lf.gateway
        assert gw.fleet.in_flight.sum() == 0
