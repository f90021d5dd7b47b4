"""Saturation between scrapes: the engine's queue is estimated from its last scrape plus this gateway's
net traffic since (routed minus finished), so a replica turning over short requests is not saturated."""

import numpy as np

from steersman.config import DEFAULTS
from steersman.engines.base import EngineMetrics
from steersman.fleet.state import Fleet, Replica
from steersman.policy.saturation import saturated
from steersman.testing.clock import FakeClock

S_ = DEFAULTS.scheduler
DEPTH = S_.saturation_queue_depth


def _fleet() -> Fleet:
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "engine-sim", "H100", ("llama-3.1-8b",), "p", 2.0, 1,
                    adapter=None) for i in range(2)]
    f = Fleet(reps, FakeClock(start=10.0))
    f.update_metrics(0, EngineMetrics(32, 2, 0.1))  # queueing at the scrape: no free slot
    f.update_metrics(1, EngineMetrics(32, 0, 0.1))
    return f


def _sat(f: Fleet) -> list[bool]:
    return saturated(f.snapshot(), np.arange(2), S_).tolist()


def test_requests_that_finished_since_the_scrape_free_the_queue_they_would_have_filled():
    f = _fleet()
    for _ in range(10 * DEPTH):  # many short requests come and go between two scrapes
        f.end(f.begin(0), 4)
    assert _sat(f) == [False, False]


def test_net_arrivals_since_the_scrape_join_the_queue_of_an_engine_with_no_free_slot():
    f = _fleet()
    held = [f.begin(0) for _ in range(DEPTH - 2)]  # 2 waiting at the scrape + DEPTH - 2 new ones
    assert _sat(f) == [True, False]
    f.end(held.pop(), 4)  # one left: DEPTH - 1 queued
    assert _sat(f) == [False, False]


def test_more_finished_than_routed_counts_as_room_for_the_waiting_ones():
    f = _fleet()
    old = [f.begin(0) for _ in range(3)]
    f.update_metrics(0, EngineMetrics(32, DEPTH, 0.1))  # saturated by its own report
    assert _sat(f) == [True, False]
    for t in old:  # three of the engine's requests finish: three of the waiting ones start
        f.end(t, 4)
    assert _sat(f) == [False, False]
    for _ in range(3):
        f.begin(0)
    assert _sat(f) == [True, False]
