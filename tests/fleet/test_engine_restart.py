"""An engine that restarted (its cumulative prompt counters went back) lost its KV cache: the prefix
index stops crediting it with the prompts it held before, and learns it anew from then on."""

from __future__ import annotations

import time
from dataclasses import replace

import httpx

from steersman.engines.base import EngineMetrics
from steersman.enginesim.app import SimServer, SimServerConfig
from steersman.fleet import snapshot as S
from steersman.fleet.prefix_index import PrefixIndex
from steersman.fleet.state import Fleet, Replica
from steersman.testing import LiveFleet
from steersman.testing.clock import FakeClock

HASHES = tuple(range(500, 530))


def _fleet() -> Fleet:
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "engine-sim", "H100", ("m",), "p", 2.0, 1, adapter=None)
            for i in range(2)]
    f = Fleet(reps, FakeClock(start=1.0))
    f.prefix = PrefixIndex(2, 8 * 2**20)
    return f


def test_a_counter_that_goes_back_forgets_that_replica_only():
    f = _fleet()
    f.prefix.record(0, HASHES)
    f.prefix.record(1, HASHES)
    f.update_metrics(0, EngineMetrics(1, 0, 0.1, prefix_queries=4000, prefix_hits=3000))
    f.update_metrics(0, EngineMetrics(1, 0, 0.1, prefix_queries=4800, prefix_hits=3500))  # growing: same process
    f.update_metrics(0, EngineMetrics(1, 0, 0.1, prefix_queries=4800, prefix_hits=3500))  # idle: unchanged
    assert f.prefix.match(HASHES).tolist() == [30, 30]
    f.update_metrics(0, EngineMetrics(0, 0, 0.0, prefix_queries=120, prefix_hits=0))  # restarted
    assert f.prefix.match(HASHES).tolist() == [0, 30]
    f.prefix.record(0, HASHES)  # what it runs from now on counts again
    f.update_metrics(0, EngineMetrics(1, 0, 0.1, prefix_queries=600, prefix_hits=400))
    assert f.prefix.match(HASHES).tolist() == [30, 30]


def test_an_engine_without_prefix_counters_is_never_forgotten():
    f = _fleet()
    f.prefix.record(0, HASHES)
    for _ in range(3):
        f.update_metrics(0, EngineMetrics(1, 0, 0.1))  # no counters reported: 0 every time
    assert f.prefix.match(HASHES).tolist() == [30, 0]


def _until(cond, what: str, timeout: float = 10.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting: {what}"
        time.sleep(0.01)


def test_a_restarted_engine_sim_behind_the_gateway_is_credited_with_nothing():
    prompt = " ".join(f"policy clause {i} applies to parcels" for i in range(120))  # ~900 tokens
    body = {"model": "llama-3.1-8b", "max_tokens": 2, "messages": [{"role": "user", "content": prompt}]}
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)]) as lf:
        gw = lf.gateway
        index = gw.fleet.prefix
        assert httpx.post(lf.url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        _until(lambda: index.blocks_per_replica()[0] > 40, "the index credits the replica with the prompt")
        _until(lambda: gw.fleet.live[S.PREFIX_QUERIES, 0] > 0, "a scrape read the engine's prompt counter")

        async def restart() -> None:
            old = lf.sims[0]
            await old.stop()
            new = SimServer(replace(old.cfg, port=old.port))
            await new.start()
            lf.sims[0] = new

        lf.call(restart)
        _until(lambda: index.blocks_per_replica()[0] == 0, "the index forgets the restarted replica")
        assert httpx.post(lf.url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        _until(lambda: index.blocks_per_replica()[0] > 40, "the index learns the replica anew")
