"""The gateway's warm-up decisions (made at start to compile the routing kernels) are no requests: they take no turn
of a rotation, so a live gateway's first request is placed as the digital twin's first one (which makes none).
Round-robin's first request went to its second replica; the steersman picker's first tie took its second turn."""

import httpx

from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet


def _served(lf) -> list[int]:
    return [int(s.engine.state(s.clock.now()).generation_tokens_total > 0) for s in lf.sims]


def _one(lf) -> None:
    r = httpx.post(lf.url + "/v1/chat/completions", json={
        "model": "llama-3.1-8b", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200


def test_round_robins_first_request_goes_to_its_first_replica():
    with LiveFleet(sims=[SimServerConfig(port=0, speedup=50.0) for _ in range(3)], policy="round-robin") as lf:
        _one(lf)
        assert _served(lf) == [1, 0, 0]
        _one(lf)
        assert _served(lf) == [1, 1, 0]


def test_the_steersman_pickers_first_tie_takes_the_first_turn():
    with LiveFleet(sims=[SimServerConfig(port=0, speedup=50.0) for _ in range(2)]) as lf:
        _one(lf)  # two idle, identical replicas: a tie
        assert _served(lf) == [1, 0]
