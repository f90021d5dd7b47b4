"""Deadlines reach the engine: at the deadline the upstream exchange is dropped and the client gets 504."""

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
        t0 = time.monotonic()  # a stream: its headers went out, so it ends with an error event
        with httpx.stream("POST", url, json={**body("a stream"), "stream": True},
                          headers={"x-steersman-deadline-ms": "400"}, timeout=30) as s:
            text = s.read().decode()
        assert s.status_code == 200 and "deadline_exceeded" in text, text
        assert time.monotonic() - t0 < 2.0
        fault(engine.url)
        gw = lf.gateway
        assert gw.fleet.in_flight.sum() == 0
