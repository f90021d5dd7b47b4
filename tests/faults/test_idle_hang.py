"""A replica that hangs while idle is found by an idle probe and ejected before a request reaches it.

Nothing of ours runs on an idle replica, so the stall rule has nothing to judge and a hung GPU's engine still
answers /metrics: without the probe the first request sent there waited for the stall rule (and a hung
replica was only ever found by hurting a request).  Times are the issue's divided by SPEEDUP (conftest).
"""

import time

from openai import OpenAI

from conftest import MODEL, SPEEDUP, fault, scaled, until
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet

PROBE_S = 5.0 / SPEEDUP  # the defaults (5 s idle, 4 s timeout), scaled
TIMEOUT_S = 4.0 / SPEEDUP


async def _state(gw, replica: int) -> dict:
    return gw.fleet.guard.state(replica, gw.clock.now())


async def _blocked(gw, replica: int) -> bool:
    return gw.fleet.blocked(replica)


async def _probes(gw) -> dict:
    return {k: v for k, v in gw.prober.counts.values.items()}


def test_an_idle_hung_replica_is_ejected_by_a_probe_and_returns_once_it_answers():
    sims = [SimServerConfig(speedup=SPEEDUP, port=0) for _ in range(2)]
    rel = scaled(idle_probe_s=PROBE_S, idle_probe_timeout_s=TIMEOUT_S)
    with LiveFleet(sims=sims, extra={"reliability": rel}) as lf:
        gw = lf.gateway
        names = [r.name for r in gw.fleet.replicas]
        # both idle from the start: each is probed after PROBE_S and answers
        until(lambda: all(lf.call(_probes, gw).get((n, "ok"), 0) >= 1 for n in names), "both replicas answer a probe",
              timeout=5.0)
        fault(lf.sims[1].url, hang=True)
        t0 = time.monotonic()
        took = until(lambda: lf.call(_blocked, gw, 1), "the idle hung replica is ejected", timeout=5.0)
        assert took < PROBE_S + TIMEOUT_S + 0.5, took  # silent an interval, then the probe's timeout
        st = lf.call(_state, gw, 1)
        assert "idle probe" in st["reason"] and st["ejections"] == 1, st
        assert not lf.call(_blocked, gw, 0) and lf.call(_state, gw, 0)["ejections"] == 0
        assert lf.call(_probes, gw).get((names[1], "timeout"), 0) == 1

        client = OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=5.0)
        for k in range(4):  # none reaches the hung replica: each is answered at once by the healthy one
            t = time.monotonic()
            r = client.chat.completions.create(model=MODEL, max_tokens=4,
                                               messages=[{"role": "user", "content": f"question {k}"}])
            assert r.choices[0].message.content and time.monotonic() - t < 1.0
        assert lf.call(_state, gw, 1)["ejections"] == 1 and time.monotonic() - t0 < rel["base_ejection_time_s"]

        fault(lf.sims[1].url)  # the hang lifts: once its ejection ends it is probed at once, answers, and is back
        until(lambda: lf.call(_probes, gw).get((names[1], "ok"), 0) >= 2, "the recovered replica answers a probe",
              timeout=rel["base_ejection_time_s"] + 3.0)
        st = lf.call(_state, gw, 1)
        assert not st["ejected"] and not st["probation"], st
