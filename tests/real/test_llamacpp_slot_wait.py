"""On two fresh llama-server replicas: the gateway calibrates their speed before it serves, and a burst of
requests sharing one uncached prompt computes it once per replica (the rest wait for those slots and reuse
them: scheduler.slot_wait) instead of once per request."""

from __future__ import annotations

import concurrent.futures as cf
import math

import httpx
import pytest

from realhelpers import MODEL, counters, start_fleet, stop_fleet
from steersman.fleet import snapshot as S

pytestmark = pytest.mark.timeout(240)

PREFIX = "You are the dispatcher of Borealis Freight. " + " ".join(
    f"Clause {i}: a container of grade {i} is sealed at gate {i % 9} and weighed twice before loading." for i in range(40)
)


@pytest.fixture(scope="module")
def engines():
    f = start_fleet(2)  # fresh: no timing learnt, nothing cached
    try:
        yield f
    finally:
        stop_fleet(f)


def _ask(c: httpx.Client, url: str, k: int) -> str:
    body = {"model": MODEL, "stream": True, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": PREFIX}, {"role": "user", "content": f"Question {k}: when?"}]}
    text = []
    with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content":"' in line:
                text.append(line)
    return "".join(text)


def test_a_cold_burst_computes_the_shared_prompt_once_per_replica(engines):
    from steersman.testing import LiveFleet

    urls = [e["url"] for e in engines.endpoints()]
    # the defaults: on a CI machine busy with other work the engines ran ~4x slower than their calibration, and a
    # waiter that gave up on a copy 50% past its predicted end computed a third copy (one reuse instead of two);
    # a late copy is now predicted to run later still (scheduler.slot_wait_overrun), and going now was slower
    with LiveFleet(endpoints=engines.endpoints(), policy="steersman") as lf, httpx.Client(timeout=120) as c:
        live = lf.gateway.fleet.live
        # calibrated before it served: the engines' own seconds per prompt token and per generated token
        for row in (S.PREFILL_S_TOKEN, S.DECODE_S_TOKEN):
            for i in range(2):
                assert math.isfinite(live[row, i]) and 1e-5 < live[row, i] < 1.0, (row, i, live[row, i])
        before = [counters(u) for u in urls]
        with cf.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda k: _ask(c, lf.url, k), range(4)))
        after = [counters(u) for u in urls]
    assert all(answers)
    computed = sum(a["processed"] - b["processed"] for a, b in zip(after, before))
    cached = sum(a["cached"] - b["cached"] for a, b in zip(after, before))
    prompt = (computed + cached) / 4
    assert prompt > 500
    # two copies computed (one per replica) and reused twice; sent at once, four copies and nothing reused
    assert cached > 1.5 * prompt, f"reused {cached:.0f} of {4 * prompt:.0f} prompt tokens"
    assert computed < 2.6 * prompt
