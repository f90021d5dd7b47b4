"""The twin with scheduler.kv_events: the engine models publish their KV events; profiles that read them
(steersman, dynamo-kv) get each replica's match from them, the others keep the approximate index."""

from __future__ import annotations

from dataclasses import replace

import pytest

from steersman.config import DEFAULTS
from steersman.policy import make_policy
from steersman.twin import ReplicaPlan, Twin, TwinConfig, TwinFleet, summarize

from tests.twin.test_core_smoke import Poisson


def _fleet(kv_events: bool) -> TwinFleet:
    # small KV caches (1/20 of the HBM share) so that blocks are evicted during the run
    sched = replace(DEFAULTS.scheduler, kv_events=kv_events)
    return TwinFleet([ReplicaPlan(f"h{i}", "H100", "llama-3.1-8b",
                                  engine=replace(DEFAULTS.engine, gpu_memory_utilization=0.25, max_model_len=8192)) for i in range(2)], sched)


def _cached(pool) -> set[int]:
    return {h for s in pool._segments() for h in s.hs[s.lo : s.hi]}


@pytest.mark.parametrize("policy, reads", [("steersman", True), ("dynamo-kv", True), ("least-request", False),
                                           ("sglang-cache-aware", False)])
def test_profiles_that_read_kv_events_see_the_engines_caches(policy, reads):
    fleet = _fleet(True)
    twin = Twin(fleet, Poisson(20.0, 600, shared=10), make_policy(policy, fleet.scheduler), cfg=TwinConfig())
    s = summarize(twin.run())
    assert s["completed"] == 600
    index = twin.fleet.prefix
    assert set(index.events) == ({0, 1} if reads else set())
    for i, r in enumerate(fleet.replicas):
        if reads:
            mirror = index.events[i]
            assert mirror._held == _cached(r.engine.kv)
            assert not mirror._pending  # every prompt routed there was credited until its first token, then let go
            assert mirror.removed_events > 0  # evictions reached the index
            assert index.blocks_per_replica()[i] == 0  # nothing recorded from routing
        else:
            assert r.engine.kv.listener is None


def test_off_by_default_and_the_same_run_without_it():
    assert DEFAULTS.scheduler.kv_events is False
    runs = {}
    for on in (False, True):
        fleet = _fleet(on)
        twin = Twin(fleet, Poisson(20.0, 300, shared=20), make_policy("steersman", fleet.scheduler), cfg=TwinConfig())
        runs[on] = summarize(twin.run())
        assert bool(twin.fleet.prefix.events) is on
    assert runs[False]["completed"] == runs[True]["completed"] == 300
